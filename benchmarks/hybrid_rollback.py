# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""What it costs to bring a hybrid target's recurrent state back to the accepted prefix, per DFlash cycle.

A random Qwen3.5-shaped target (3 of 4 layers Gated DeltaNet, 1 full attention; sizes below) on this machine:
t(1) one decoding step, t(verify) one verify forward over [anchor + 15 drafts], t(save) cloning the recurrent states
before it, t(restore) copying them back, t(re-advance k) one target forward over the k committed tokens. The loop pays
save every cycle and restore + re-advance only after a partial acceptance (k = accepted + 1 < 16).

    python benchmarks/hybrid_rollback.py --threads 2 --json hybrid_rollback.json
"""

import argparse
import json
import statistics
import time

import torch
from transformers import DynamicCache, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from hf_dflash.cache_dflash import RecurrentStates
from hf_dflash.evaluation.machine import load_average, run_stamp


def timed(fn, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` runs (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--context", type=int, default=256, help="tokens in the cache before the cycle")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = load_average()
    heads = args.hidden_size // 64
    config = Qwen3_5TextConfig(
        vocab_size=32000, hidden_size=args.hidden_size, intermediate_size=3 * args.hidden_size,
        num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 4),
        head_dim=64, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (args.layers // 4),
        linear_num_key_heads=heads // 2, linear_num_value_heads=heads, linear_key_head_dim=64,
        linear_value_head_dim=64,
    )
    torch.manual_seed(0)
    target = Qwen3_5ForCausalLM(config).eval().requires_grad_(False)
    ids = torch.randint(0, 32000, (1, args.context + 16))
    cache = DynamicCache(config=target.config)
    cache.activate_past_recording()
    with torch.no_grad():
        target(input_ids=ids[:, : args.context], cache=cache, use_cache=True)
    states = RecurrentStates(cache)

    def forward(tokens: torch.Tensor):
        def run():
            with torch.no_grad():
                target(input_ids=tokens, cache=cache, use_cache=True, logits_to_keep=1)
            cache.crop(-tokens.shape[1])
        return run

    results = {
        "config": {"hidden_size": args.hidden_size, "layers": args.layers, "context": args.context,
                   "threads": torch.get_num_threads(), "state_bytes": sum(
                       s.numel() * s.element_size() for d in states.saved or [] for s in d.values())},
        "t1_ms": 1e3 * timed(forward(ids[:, args.context : args.context + 1]), args.repeats),
        "t_verify16_ms": 1e3 * timed(forward(ids[:, args.context : args.context + 16]), args.repeats),
        "t_save_ms": 1e3 * timed(states.save, args.repeats),
        "t_restore_ms": 1e3 * timed(states.restore, args.repeats),
        "t_readvance_ms": {k: 1e3 * timed(forward(ids[:, args.context : args.context + k]), args.repeats)
                           for k in (1, 2, 4, 8, 15)},
    }
    states.save()
    results["config"]["state_bytes"] = sum(s.numel() * s.element_size() for d in states.saved for s in d.values())
    results["machine"] = run_stamp("cpu", load_before)
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
