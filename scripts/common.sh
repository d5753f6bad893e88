# Shared environment of the scripts/*.sh long jobs (sourced, not run): the Python and hf-dflash commands, the cache
# folders, and one OpenMP thread per process (two CPU-heavy jobs on 2 cores oversubscribe otherwise: 6-25x slower).
# Every name can be overridden from the environment: PYTHON, HF_DFLASH, HF_DFLASH_CACHE, NICE, OMP_NUM_THREADS.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
HF_DFLASH="${HF_DFLASH:-$PYTHON -m hf_dflash}"
CACHE="${HF_DFLASH_CACHE:-$HOME/.cache/hf_dflash}"
TRAIN="$CACHE/train"
NICE="${NICE-nice -n 5}"  # NICE= (empty) runs at normal priority
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export HF_DFLASH_CACHE="$CACHE"
