# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""A drafter checkpoint as files and as engines read it: which Hub id names the target, which weights a saved folder
holds (read from the safetensors headers, without loading them), what vLLM cannot serve in a drafter config, and
an LM head's rows as plain weights (a quantized head's dequantized).

Part of the remote-code payload: imports only torch, transformers (and huggingface_hub, which it requires) and the
standard library.
"""

import json
import os
import re

import torch
from transformers.utils import logging


logger = logging.get_logger(__name__)


def check_serving_layout(config, head_rows: int | None) -> None:
    """Raise a ValueError when a drafter with `config` and a draft LM head of `head_rows` rows (None: none) cannot be
    saved in a layout serving engines read right; warn about what they refuse by themselves.

    - A draft vocabulary without its draft LM head: vLLM would load it without a word and score drafts with the
      target's first ``draft_vocab_size`` rows, i.e. the wrong tokens (measured: 0 drafts accepted).
    - Warned about, saved all the same (hf-dflash runs them; see :func:`serving_problems`): DFlare switches
      (`layer_fusion`, `split_context_kv`: saved as ``QwenDFlareDraftModel``, an architecture vLLM 0.32 does
      not have and refuses at load), target layer ids vLLM reads differently (unsorted, repeated, the last).

    Example:
        >>> from hf_dflash import DFlashConfig
        >>> check_serving_layout(DFlashConfig(target_layer_ids=[1], draft_vocab_size=8), head_rows=None)
        Traceback (most recent call last):
        ...
        ValueError: This drafter drafts among draft_vocab_size=8 tokens but holds no draft LM head: ...
    """
    if config.draft_vocab_size and head_rows != config.draft_vocab_size:
        raise ValueError(
            f"This drafter drafts among draft_vocab_size={config.draft_vocab_size} tokens but holds "
            f"{'no draft LM head' if head_rows is None else f'a draft LM head of {head_rows} rows'}: vLLM scores "
            "drafts with the checkpoint's own lm_head.weight of draft_vocab_size rows (EAGLE-3 layout) and, without "
            "it, with the target's first rows, the wrong tokens. Give it the target's rows before saving: "
            "drafter.set_draft_vocabulary(drafter.draft_token_ids(), lm_head=target.get_output_embeddings()); "
            "or draft among the whole vocabulary: drafter.set_draft_vocabulary(None)."
        )
    for problem in serving_problems(config):
        logger.warning_once(f"vLLM will not serve this drafter as hf-dflash runs it: {problem}.")


def serving_problems(config) -> list[str]:
    """What vLLM (0.32, `method: "dflash"`) cannot serve in a drafter with this config, one reason per entry.

    vLLM's DFlash drafter (`vllm/model_executor/models/qwen3_dflash.py`) projects ONE context, `fc` then
    `hidden_norm`, for all layers, and writes its K/V with each layer's own `k_proj`/`v_proj` (fused with `q_proj`
    into `qkv_proj`). Its registry has no DFlare architecture, so it refuses ``QwenDFlareDraftModel`` at load. The
    target collects the features at ``target_layer_ids + 1`` in layer order, each layer once, as the residual stream
    (`vllm/model_executor/models/interfaces.py`, ``_maybe_add_hidden_state``).

    Example:
        >>> from hf_dflash import DFlashConfig
        >>> [p.split(":")[0] for p in serving_problems(DFlashConfig(target_layer_ids=[1], split_context_kv=True))]
        ['split_context_kv']
    """
    problems = []
    ids = list(getattr(config, "target_layer_ids", None) or [])
    if ids != sorted(set(ids)):
        problems.append(f"target_layer_ids={ids} are not strictly increasing: vLLM collects each target layer once, "
                        "in layer order (its fc then reads other features than it was trained on, or fewer)")
    last = (getattr(config, "num_target_layers", None) or 0) - 1
    if last in ids:
        problems.append(f"target layer {last} is the target's last: transformers' hidden_states give it after the "
                        "final norm, vLLM before it")
    if getattr(config, "layer_fusion", False):
        problems.append("layer_fusion: each layer mixes the target features with its own softmax weights; vLLM "
                        "projects one context (fc) shared by all layers (architecture QwenDFlareDraftModel, which "
                        "vLLM refuses to load)")
    if getattr(config, "split_context_kv", False):
        problems.append("split_context_kv: context tokens have their own k_proj_target/v_proj_target; vLLM projects "
                        "the context with the k_proj/v_proj of the block (architecture QwenDFlareDraftModel, which "
                        "vLLM refuses to load)")
    return problems


def hub_id_of(name_or_path: str | os.PathLike | None) -> str | None:
    """The Hub id a target was loaded from, for config fields that must not name a local folder: a Hub id as it is,
    a Hub cache snapshot folder (``.../models--org--name/snapshots/<sha>``) as ``org/name``, anything else None.

    Example:
        >>> hub_id_of("HuggingFaceTB/SmolLM2-135M-Instruct")
        'HuggingFaceTB/SmolLM2-135M-Instruct'
        >>> hub_id_of("/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B/snapshots/0123abcd")
        'Qwen/Qwen3-8B'
        >>> hub_id_of("/root/.cache/hf_dflash/models/SmolLM2-135M-Instruct") is None
        True
    """
    if not name_or_path:
        return None
    text = str(name_or_path)
    cached = re.search(r"models--([\w.-]+?)--([\w.-]+)/snapshots/", text.replace(os.sep, "/") + "/")
    if cached:
        return f"{cached.group(1)}/{cached.group(2)}"
    if os.path.exists(text) or not re.fullmatch(r"[\w][\w.-]*(/[\w][\w.-]*)?", text):
        return None  # a local folder, or a path that is gone: it names nothing on another machine
    return text


def local_or_cached_config(name_or_path, kwargs) -> str | None:
    """Path of config.json in a local folder or the HF cache, without network access."""
    return _local_or_cached_file(name_or_path, "config.json", kwargs)


def _local_or_cached_file(name_or_path, filename: str, kwargs, local_files_only: bool | None = None) -> str | None:
    """Path of `filename` in a local folder, else in the HF cache (downloaded unless `local_files_only`), else None."""
    if os.path.isdir(str(name_or_path)):
        path = os.path.join(str(name_or_path), kwargs.get("subfolder", "") or "", filename)
        return path if os.path.isfile(path) else None
    try:
        from huggingface_hub import hf_hub_download

        return hf_hub_download(
            str(name_or_path),
            filename,
            subfolder=kwargs.get("subfolder") or None,
            revision=kwargs.get("revision"),
            cache_dir=kwargs.get("cache_dir"),
            token=kwargs.get("token"),
            local_files_only=kwargs.get("local_files_only", False) if local_files_only is None else local_files_only,
        )
    except Exception:  # the real loading reports missing repos/files with HF's own messages
        return None


def saved_weight_names(name_or_path, kwargs=None, download: bool = False) -> set[str] | None:
    """Names of the weights of a safetensors checkpoint (one file or an index), read from the file headers in a
    local folder or the HF cache (with `download`, fetched there first, as loading would); None when they cannot be
    read (e.g. a .bin checkpoint).

    Example:
        >>> sorted(saved_weight_names("my-drafter"))[:2]  # doctest: +SKIP
        ['d2t', 'fc.weight']
    """
    kwargs = kwargs or {}
    local = None if download else True
    index = _local_or_cached_file(name_or_path, "model.safetensors.index.json", kwargs, local_files_only=local)
    if index is not None:
        with open(index, encoding="utf-8") as f:
            return set(json.load(f)["weight_map"])
    header = _safetensors_header(name_or_path, kwargs, local)
    return None if header is None else set(header)


# safetensors' dtype names, as torch names them
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def saved_weight_dtype(name_or_path) -> str | None:
    """The torch dtype name of the weights a drafter was saved in (its ``fc`` or first floating weight; a
    single-file safetensors checkpoint in a local folder or the HF cache, nothing downloaded), or None when unknown.

    ``config.dtype`` cannot say it after loading: ``from_pretrained(dtype=...)`` overwrites it with the dtype asked for.

    Example:
        >>> saved_weight_dtype("my-drafter")  # doctest: +SKIP
        'float32'
    """
    header = _safetensors_header(name_or_path, {}, local_files_only=True) if name_or_path else None
    if not header:
        return None
    floating = [entry["dtype"] for _, entry in sorted(header.items()) if entry.get("dtype", "").startswith(("F", "BF"))]
    return SAFETENSORS_DTYPES.get(header.get("fc.weight", {}).get("dtype") or (floating[0] if floating else None))


def _safetensors_header(name_or_path, kwargs, local_files_only: bool | None) -> dict | None:
    """{weight name: {"dtype", "shape", ...}} of a single-file safetensors checkpoint, or None where there is none."""
    single = _local_or_cached_file(name_or_path, "model.safetensors", kwargs, local_files_only=local_files_only)
    if single is None:
        return None
    with open(single, "rb") as f:  # safetensors: 8-byte little-endian header size, then a JSON header
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    return header


def plain_head_rows(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of an LM head `weight` as a plain tensor of its dtype. The rows of a draft vocabulary are multiplied
    outside the head's own kernel, so a quantized weight (torchao's int8 tensor subclass, a torch quantized tensor)
    is dequantized: a quantized target's head scores the drafts with the values it holds.

    Example:
        >>> plain_head_rows(torch.eye(3, dtype=torch.bfloat16), torch.tensor([2]))
        tensor([[0., 0., 1.]], dtype=torch.bfloat16)
    """
    rows = weight[ids]
    # torch's quantized tensors, and tensor subclasses with their own dequantize (torchao's); other tensors as they are
    quantized = rows.is_quantized or type(rows).dequantize is not torch.Tensor.dequantize
    return rows.dequantize() if quantized else rows
