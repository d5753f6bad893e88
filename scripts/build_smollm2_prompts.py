#!/usr/bin/env python
# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Build the training prompts of the shipped SmolLM2-135M-Instruct DFlash drafter (a JSONL of ``{"prompt": ...}``):
ShareGPT chat, standard-library code and templated math, none of them an evaluation prompt; ``--workloads N`` adds N
prompts of each kind the bench's workloads measure. What each source is and how they are kept apart from the
evaluation: :mod:`hf_dflash.evaluation.training_prompts`.

    python scripts/build_smollm2_prompts.py                       # -> ~/.cache/hf_dflash/train/smollm2_prompts.jsonl
    python scripts/build_smollm2_prompts.py --num-prompts 400 --seed 1 --output prompts.jsonl
    python scripts/build_smollm2_prompts.py --workloads 90 --output prompts_workloads.jsonl
    python scripts/build_smollm2_prompts.py --num-prompts 3200 --workloads 90 --workloads-only --output w.jsonl
"""

from hf_dflash.evaluation.training_prompts import main

if __name__ == "__main__":
    raise SystemExit(main())
