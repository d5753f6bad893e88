# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""``hf-dflash bench --batch-sizes``: tokens/s of plain batched ``generate`` against the DFlash path, side by side.

Example:
    $ hf-dflash bench --batch-sizes 1,4,8,16 --max-new-tokens 128
"""

import statistics

import torch
from tqdm.auto import tqdm

from ..data.chat import chat_input_ids, left_padded_batch
from ..models import pad_token_id
from ..timing_dflash import synchronized_clock


def new_token_count(output: torch.Tensor, prompt_length: int, pad_token_id: int) -> int:
    """Generated tokens in a batch output, without the padding of rows that finished early."""
    return int((output[:, prompt_length:] != pad_token_id).sum())


def run_batch_benchmark(target, tokenizer, drafter, prompts: list[str], batch_sizes: list[int],
                        max_new_tokens: int = 128, repeats: int = 2) -> list[dict]:
    """Tokens/s of plain batched generate vs the DFlash path at each batch size, measured side by side.

    Each batch size runs the first `b` prompts, alternating plain and DFlash `repeats` times (medians), and checks
    the outputs are identical.

    Example:
        >>> rows = run_batch_benchmark(target, tok, drafter, load_eval_prompts("gsm8k", 16), [1, 4, 16])  # doctest: +SKIP
        >>> rows[0]["speedup"]  # doctest: +SKIP
    """
    pad = pad_token_id(target)
    encoded = [chat_input_ids(tokenizer, p, target.device) for p in prompts]
    rows = []
    for batch_size in tqdm(batch_sizes, desc="batch bench", unit="batch size"):
        if batch_size > len(encoded):
            raise ValueError(f"batch size {batch_size} needs {batch_size} prompts, got {len(encoded)}.")
        ids, mask = left_padded_batch(encoded[:batch_size], pad)
        settings = dict(attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
        times = {"plain": [], "dflash": []}
        outputs = {}
        for _ in range(repeats):
            for method, extra in (("plain", {}), ("dflash", {"assistant_model": drafter})):
                start = synchronized_clock(target.device)
                with torch.inference_mode():
                    outputs[method] = target.generate(ids, **settings, **extra)
                times[method].append(synchronized_clock(target.device) - start)
        tokens = new_token_count(outputs["plain"], ids.shape[1], pad)
        plain_s, dflash_s = statistics.median(times["plain"]), statistics.median(times["dflash"])
        rows.append({
            "batch_size": batch_size,
            "new_tokens": tokens,
            "plain_tokens_per_s": tokens / plain_s,
            "dflash_tokens_per_s": tokens / dflash_s,
            "speedup": plain_s / dflash_s,
            "tau": drafter.last_stats.mean_acceptance_length,
            "identical": bool(torch.equal(outputs["plain"], outputs["dflash"])),
        })
    return rows
