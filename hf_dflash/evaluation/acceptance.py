# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Acceptance length tau (accepted drafts + 1 per verification) and acceptance by block position, measured with
real ``generate`` calls: the numbers training reports and the benchmark prints come from here.
"""

from typing import Any

import torch
from transformers import GenerationConfig

from ..stats_dflash import DFlashStats, acceptance_by_position
from ..models import pad_token_id


@torch.no_grad()
def measure_acceptance_length(target, drafter, prompts: list[list[int]], max_new_tokens: int = 128) -> dict[str, Any]:
    """Mean acceptance length tau measured by real greedy ``target.generate(assistant_model=drafter)`` calls that
    verify the drafter's whole block every cycle (``dflash_policy="full"``: the drafter's tau, not the default
    policy's mix of plain steps and prompt-lookup drafts).

    Example:
        >>> measure_acceptance_length(target, drafter, [tokenizer("Hi")["input_ids"]])["tau"]  # doctest: +SKIP
        3.7
    """
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=target.generation_config.eos_token_id,
        pad_token_id=pad_token_id(target),
        bos_token_id=target.generation_config.bos_token_id,
    )
    lengths, per_prompt = [], []
    for ids in prompts:
        input_ids = torch.tensor([ids], device=target.device)
        target.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config,
                        assistant_model=drafter, dflash_policy="full")
        lengths += drafter.last_stats.acceptance_lengths
        per_prompt.append(drafter.last_stats.mean_acceptance_length)
    block = drafter.config.block_size
    return {
        "tau": sum(lengths) / len(lengths) if lengths else 0.0,
        "tau_per_prompt": per_prompt,
        "acceptance_by_position": acceptance_by_position(lengths, block),
        "num_prompts": len(prompts),
        "num_verifications": len(lengths),
        "max_new_tokens": max_new_tokens,
    }


def acceptance_histogram(stats: list[DFlashStats]) -> list[int]:
    """Counts of acceptance lengths 1..block_size over all verifications (index 0 = nothing accepted); longer when a
    tree's n-gram branch accepted more than a block.

    Example:
        >>> acceptance_histogram([DFlashStats(block_size=4, acceptance_lengths=[1, 4, 2, 1])])
        [2, 1, 0, 1]
    """
    if not stats:
        return []
    counts = [0] * max([stats[0].block_size] + [a for s in stats for a in s.acceptance_lengths])
    for s in stats:
        for a in s.acceptance_lengths:
            counts[a - 1] += 1
    return counts


def pooled_acceptance_by_position(stats: list[DFlashStats]) -> list[float]:
    """Fraction of all verifications of several ``generate`` calls whose draft at block position k was accepted.

    Example:
        >>> pooled_acceptance_by_position([DFlashStats(block_size=4, acceptance_lengths=[1, 4, 2, 1])])
        [0.5, 0.25, 0.25]
    """
    if not stats:
        return []
    return acceptance_by_position([a for s in stats for a in s.acceptance_lengths], stats[0].block_size)
