# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""hf-dflash: lossless block-diffusion speculative decoding (DFlash, DFlare, DFlash2) for Hugging Face transformers.

Importing this package routes ``model.generate(..., assistant_model=drafter)`` to the DFlash loop whenever the
assistant is a DFlash drafter; other assistants are untouched.

Example:
    >>> import hf_dflash
    >>> drafter = hf_dflash.DFlashDraftModel.from_target(target, num_hidden_layers=2)  # doctest: +SKIP
    >>> out = target.generate(**inputs, assistant_model=drafter, max_new_tokens=256)  # doctest: +SKIP
"""

from .configuration_dflash import DFlashConfig, default_target_layer_ids
from .generation_dflash import (
    DFlashCandidateGenerator,
    DFlashStats,
    builtin_generation,
    check_drafter_matches_target,
    dflash_decoding,
    disable_dflash_generation,
    enable_dflash_generation,
    is_dflash_drafter,
)
from .modeling_dflash import DFlashDraftModel
from .capture_dflash import use_cpu_kernels
from .kernels_cpu import few_row_kernels
from .configuration_dflash2 import DFlash2Config
from .modeling_dflash2 import DFlash2DraftModel  # also lets DFlashDraftModel.from_pretrained load DFlash2 checkpoints


use_cpu_kernels(few_row_kernels)  # DFlash calls on a CPU that opt in compute few-row verifies with it (kernels_cpu.py)

__version__ = "0.1.0"

__all__ = [
    "DFlash2Config",
    "DFlash2DraftModel",
    "DFlashCandidateGenerator",
    "DFlashConfig",
    "DFlashDraftModel",
    "DFlashStats",
    "builtin_generation",
    "check_drafter_matches_target",
    "default_target_layer_ids",
    "dflash_decoding",
    "disable_dflash_generation",
    "enable_dflash_generation",
    "few_row_kernels",
    "is_dflash_drafter",
]
