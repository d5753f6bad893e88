"""DFlash2 drafters: the published layout loads and saves (with and without their own embeddings and LM
head, with remote code), mixed layouts are refused, the convolution and selector compute what vLLM computes, and
generate() drafts with the selector's path losslessly (greedy identical; sampling: drafts and q follow the selector's
law, chi-square with negative controls)."""

import collections
import contextlib
import itertools
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from conftest import (
    P_THRESHOLD,
    assert_lossless,
    chi_square_pvalue,
    count_forwards,
    every_policy_path,
    exact_distribution,
    left_padded,
    make_prompt,
    make_target,
    own_weights_folder,
    randomized,
    recorded_drafts,
    small_args,
)
from safetensors.torch import load_file
from transformers import AutoModel, GenerationConfig

import hf_dflash
from hf_dflash import DFlash2Config, DFlash2DraftModel, DFlashDraftModel
from hf_dflash import candidates_dflash
from hf_dflash.candidates_dflash import DFlashCandidateGenerator
from hf_dflash.evaluation.acceptance import measure_acceptance_length
from hf_dflash.training.loss import selector_path_losses
from hf_dflash.training.recipe import IGNORE_INDEX
from hf_dflash.training.trainer import DFlashTrainer
from hf_dflash.modeling_dflash2 import DFlash2GroupedConv

BLOCK = 8
DFLASH2_FIELDS = dict(conv_group_size=16, conv_kernel_size=3, selector_rank=8, selector_top_k=4,
                      output_multiplier=1.5, final_logit_softcapping=6.0)


def make_dflash2(target, seed: int = 0, num_hidden_layers: int = 2, block_size: int = BLOCK,
                 target_layer_ids=(0, 2), **overrides):
    torch.manual_seed(seed)
    fields = {**DFLASH2_FIELDS, **overrides}
    selector_scale = fields.pop("selector_scale", 0.3)
    drafter = DFlash2DraftModel.from_target(target, num_hidden_layers=num_hidden_layers, block_size=block_size,
                                            target_layer_ids=list(target_layer_ids), **fields)
    return randomized(drafter, seed, selector_scale=selector_scale)


@pytest.fixture(scope="module")
def target():
    return make_target("qwen3", num_hidden_layers=4)


@pytest.fixture(scope="module")
def drafter(target):
    return make_dflash2(target)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, target, drafter):
    folder = tmp_path_factory.mktemp("dflash2") / "drafter"
    drafter.save_pretrained(folder)
    return folder


# ----------------------------------------------------------------------------------------------------------------------
# layout: load, save, refuse mixtures
def test_saved_folder_is_the_published_layout(saved, drafter):
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["model_type"] == "qwen3"
    nested = config["dflash_config"]
    for name, value in {**DFLASH2_FIELDS, "block_size": BLOCK, "target_layer_ids": [0, 2],
                        "mask_token_id": drafter.config.mask_token_id}.items():
        assert nested[name] == value, name
    assert not {"has_own_embed_tokens", "has_own_lm_head", "selector_top_k"} & set(config)
    assert config["auto_map"]["AutoModel"] == "modeling_dflash2.DFlash2DraftModel"
    weights = load_file(saved / "model.safetensors")
    hidden, taps, groups, vocab = 64, 3, 64 // 16, 96
    for i in range(2):
        for conv in ("attention_conv", "mlp_conv"):
            assert weights[f"layers.{i}.{conv}.base_kernel"].shape == (2, taps, hidden)
            assert weights[f"layers.{i}.{conv}.kernel_projection.weight"].shape == (2 * taps * groups, hidden)
    assert weights["candidate_selector.predecessor_codebook"].shape == (vocab, 8)
    assert weights["candidate_selector.successor_codebook"].shape == (vocab, 8)
    assert weights["candidate_selector.hidden_projection.weight"].shape == (8, hidden)
    assert "embed_tokens.weight" not in weights and "lm_head.weight" not in weights  # shared with the target
    assert {"modeling_dflash2.py", "configuration_dflash2.py", "modeling_dflash.py"} <= {p.name for p in saved.iterdir()}
    card = (saved / "README.md").read_text()
    assert "# DFlash2 drafter" in card and '"method": "dflash"' in card and "num_speculative_tokens" in card


@pytest.mark.parametrize("loader", [DFlashDraftModel, DFlash2DraftModel, AutoModel])
def test_round_trip_by_every_loader(saved, drafter, loader):
    kwargs = {"trust_remote_code": True} if loader is AutoModel else {}
    loaded = loader.from_pretrained(saved, **kwargs)
    assert type(loaded) is DFlash2DraftModel and type(loaded.config) is DFlash2Config
    assert loaded.state_dict().keys() == drafter.state_dict().keys()
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert loaded.own_embeddings() == (None, None)


def test_own_embeddings_and_head_load_save_and_draft(saved, tmp_path, target, drafter):
    folder = own_weights_folder(saved, tmp_path / "own")
    loaded = DFlashDraftModel.from_pretrained(folder).eval()
    embed, head = loaded.own_embeddings()
    assert torch.equal(embed.weight, load_file(folder / "model.safetensors")["embed_tokens.weight"])
    assert torch.equal(head.weight, load_file(folder / "model.safetensors")["lm_head.weight"])
    generator = DFlashCandidateGenerator(loaded, target, GenerationConfig(do_sample=False))
    assert generator.input_embeddings is embed and generator.lm_head is head
    prompt = make_prompt(10, seed=1)
    with recorded_drafts() as own_drafts:
        own = target.generate(prompt, assistant_model=loaded, max_new_tokens=24, do_sample=False,
                              dflash_policy="full")
    with recorded_drafts() as shared_drafts:
        shared = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False,
                                 dflash_policy="full")
    assert torch.equal(own, shared)  # lossless either way, so both drafted after the same histories
    assert own_drafts != shared_drafts  # with its own embeddings and head
    loaded.save_pretrained(tmp_path / "again")
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert set(again) == set(load_file(folder / "model.safetensors"))
    assert "has_own_lm_head" not in json.loads((tmp_path / "again" / "config.json").read_text())


def config_with(saved, tmp_path, edit):
    folder = tmp_path / "edited"
    folder.mkdir(exist_ok=True)
    config = json.loads((saved / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((saved / "model.safetensors").read_bytes())
    return folder


MIXED = {
    "DFlash architecture, DFlash2 field": (
        lambda c: c.update(architectures=["DFlashDraftModel"]),
        r"dflash_config\.conv_group_size is a DFlash2 field.*DFlash2DraftModel.*or remove dflash_config.conv_group_size"),
    "DFlare architecture, DFlash2 field": (
        lambda c: c.update(architectures=["QwenDFlareDraftModel"]), r"dflash_config\.conv_group_size is a DFlash2"),
    "DFlash2 architecture, field missing": (
        lambda c: c["dflash_config"].pop("selector_top_k"), r"needs dflash_config\.selector_top_k.*add it"),
    "DFlash2 field at the top level": (
        lambda c: c.update(selector_rank=c["dflash_config"].pop("selector_rank")),
        r"selector_rank is a DFlash2 field at the top level.*move it to dflash_config\.selector_rank"),
    "two architectures": (
        lambda c: c.update(architectures=["DFlash2DraftModel", "DFlashDraftModel"]), r"keep one"),
    "DFlare switch": (lambda c: c.update(layer_fusion=True), r"layer_fusion=true is a DFlare switch.*remove"),
    "draft vocabulary": (lambda c: c.update(draft_vocab_size=48), r"draft_vocab_size with a DFlash2.*Remove"),
    "group size": (lambda c: c["dflash_config"].update(conv_group_size=24), r"conv_group_size=24 must divide"),
}


@pytest.mark.parametrize("case", MIXED)
@pytest.mark.parametrize("loader", [DFlashDraftModel, DFlash2DraftModel])
def test_mixed_layouts_are_refused_naming_field_and_fix(saved, tmp_path, case, loader):
    edit, message = MIXED[case]
    with pytest.raises(ValueError, match=message):
        loader.from_pretrained(config_with(saved, tmp_path, edit))


def test_dflash_config_refuses_dflash2_fields_and_dflash2_refuses_a_draft_vocabulary(drafter):
    with pytest.raises(ValueError, match="selector_top_k is a DFlash2 field"):
        hf_dflash.DFlashConfig(target_layer_ids=[1], dflash_config={"selector_top_k": 4})
    with pytest.raises(ValueError, match="cannot take a draft vocabulary"):
        drafter.set_draft_vocabulary([1, 2, 3])


def test_trust_remote_code_generates_without_hf_dflash(saved, tmp_path, target):
    (tmp_path / "target").mkdir()
    target.save_pretrained(tmp_path / "target")
    code = f"""
        import sys
        sys.modules["hf_dflash"] = None  # not installed
        import torch
        from transformers import AutoModel, AutoModelForCausalLM
        target = AutoModelForCausalLM.from_pretrained({str(tmp_path / "target")!r}).eval()
        drafter = AutoModel.from_pretrained({str(saved)!r}, trust_remote_code=True).eval()
        assert type(drafter).__name__ == "DFlash2DraftModel", type(drafter)
        assert type(drafter).__module__.startswith("transformers_modules"), type(drafter).__module__
        ids = torch.randint(1, 96, (1, 11), generator=torch.Generator().manual_seed(3))
        plain = target.generate(ids, max_new_tokens=24, do_sample=False)
        fast = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=drafter, dflash_policy="full")
        assert torch.equal(plain, fast), (plain, fast)
        print("REMOTE-OK", drafter.last_stats.acceptance_lengths)
    """
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0 and "REMOTE-OK" in result.stdout, result.stderr[-3000:]


# ----------------------------------------------------------------------------------------------------------------------
# what DFlash2 computes, against plain loops written from vLLM's definitions (modeling_dflash2's docstring)
def looped_conv(x, base, deltas, block_size: int, group_size: int):
    """out[p, c] = sum over taps t <= p's place in its block of (base[t, c] + deltas[p, t, c // group]) * x[p - t, c]."""
    rows, channels = x.shape
    out = torch.zeros_like(x)
    for p in range(rows):
        for t in range(base.shape[0]):
            if p % block_size >= t:
                for c in range(channels):
                    out[p, c] += (base[t, c] + deltas[p, t, c // group_size]) * x[p - t, c]
    return out


def test_grouped_convolution_is_causal_within_each_block():
    torch.manual_seed(0)
    conv = DFlash2GroupedConv(hidden_size=8, taps=3, group_size=4, block_size=4)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x = torch.randn(1, 8, 8)  # two blocks of 4 rows
    deltas = conv.deltas(x)
    for side in (0, 1):
        expected = looped_conv(x[0], conv.base_kernel[side], deltas[0, :, side], block_size=4, group_size=4)
        assert torch.allclose(conv(x, deltas, side)[0], expected, atol=1e-5), side
    later = x.clone()
    later[0, 2:4] += 1.0  # rows after position 1 of the first block, and nothing of the second block, change
    changed = (conv(later, deltas, 0) - conv(x, deltas, 0)).abs().sum(-1)[0]
    assert changed[:2].max() == 0 and changed[4:].max() == 0 and changed[2:4].min() > 0


def block_outputs(target, drafter, prompt):
    """The drafter's final hidden states over the block after `prompt` (its last token the anchor) and the target's
    LM-head logits at the draft positions."""
    with torch.no_grad():
        features = drafter.fused_features(target(prompt[:, :-1], output_hidden_states=True).hidden_states)
        block = torch.tensor([[int(prompt[0, -1])] + [drafter.config.mask_token_id] * (BLOCK - 1)])
        n = prompt.shape[1] - 1
        hidden = drafter(noise_embeds=target.get_input_embeddings()(block), context_hidden_states=features,
                         position_ids=torch.arange(n + BLOCK)[None], context_fused=True).last_hidden_state
    return features, hidden[0, 1:], target.lm_head(hidden[0, 1:])


def looped_selector(drafter, hidden, logits, anchor: int):
    """Candidates [d][j], unary scores [d][j] and edge scores S[d][i][j], by plain loops over vLLM's definitions."""
    config, selector = drafter.config, drafter.candidate_selector
    cap, m, k = config.final_logit_softcapping, config.output_multiplier, config.selector_top_k
    candidates = [sorted(range(logits.shape[-1]), key=lambda t: -float(row[t]))[:k] for row in logits]
    unary = [[float(cap * torch.tanh(m * row[t] / cap)) for t in cands] for row, cands in zip(logits, candidates)]
    projected = hidden @ selector.hidden_projection.weight.T
    edges = []
    for d, cands in enumerate(candidates):
        before = [anchor] * k if d == 0 else candidates[d - 1]
        edges.append([[unary[d][j] + float(sum(selector.predecessor_codebook[before[i], r] * projected[d, r]
                                               * selector.successor_codebook[cands[j], r]
                                               for r in range(config.selector_rank)))
                       for j in range(k)] for i in range(k)])
    return candidates, unary, edges


def path_law(candidates, rows, path: tuple, temperature: float) -> float:
    """P(path) of a walk whose scores at position d after candidate i are rows(d, i): the product of
    softmax(rows(d, i_{d-1}) / temperature) at the path's candidates (i_0 = 0)."""
    probability, previous = 1.0, 0
    for d, token in enumerate(path):
        index = candidates[d].index(token)
        probability *= float((torch.tensor(rows(d, previous), dtype=torch.float64) / temperature).softmax(-1)[index])
        previous = index
    return probability


def proposal(target, drafter, prompt, batch: int, **config):
    """One drafting call on `batch` copies of `prompt` (its last token the anchor): drafts [batch, B-1], scores."""
    features, _, _ = block_outputs(target, drafter, prompt)
    generation_config = GenerationConfig(**config)
    processors = target._get_logits_processor(generation_config, prompt.shape[1], prompt, None, None)
    generator = DFlashCandidateGenerator(drafter, target, generation_config, processors)
    n = prompt.shape[1] - 1
    with torch.no_grad():
        return generator.propose([prompt[0]] * batch, features.expand(batch, -1, -1),
                                 torch.arange(n).expand(batch, -1), torch.full((batch,), n))


LAW_PROMPT = make_prompt(10, seed=5)
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def selector_reference(target, drafter):
    _, hidden, logits = block_outputs(target, drafter, LAW_PROMPT)
    return looped_selector(drafter, hidden, logits, int(LAW_PROMPT[0, -1]))


def test_greedy_drafts_are_the_selectors_argmax_path(target, drafter, selector_reference):
    candidates, unary, edges = selector_reference
    drafts, _ = proposal(target, drafter, LAW_PROMPT, batch=1, do_sample=False)
    path, previous = [], 0
    for d in range(BLOCK - 1):
        previous = max(range(len(candidates[d])), key=lambda j: edges[d][previous][j])
        path.append(candidates[d][previous])
    assert drafts[0].tolist() == path
    per_position = [cands[max(range(len(u)), key=u.__getitem__)] for cands, u in zip(candidates, unary)]
    assert path != per_position  # the selector moved the path: this drafter tests the walk, not the unary argmax


SAMPLING_SETTINGS = {"temperature": dict(temperature=TEMPERATURE),
                     "temperature + top_k": dict(temperature=TEMPERATURE, top_k=2)}


def kept_rows(edges, top_k: int | None):
    """The walk's row at (d, i) after the warpers: the edge scores, all but the top `top_k` -inf."""
    def rows(d, i):
        row = list(edges[d][i])
        if top_k is None:
            return row
        cut = sorted(row, reverse=True)[top_k - 1]
        return [x if x >= cut else float("-inf") for x in row]
    return rows


@pytest.mark.parametrize("setting", SAMPLING_SETTINGS)
def test_sampled_drafts_and_q_follow_the_selectors_law(target, drafter, selector_reference, setting):
    """Sampled drafts follow P(path) = prod_d q_d(draft_d | draft_{d-1}), q_d = softmax(processed S[d, i_{d-1}, :])
    (chi-square on the first 3 drafts, 4,000 walks), the returned scores are exactly that q along each walk, and a
    law without the edges (the unary scores alone: the negative control) is rejected."""
    candidates, unary, edges = selector_reference
    config = SAMPLING_SETTINGS[setting]
    drafts, scores = proposal(target, drafter, LAW_PROMPT, batch=4000, do_sample=True, **config)
    rows = kept_rows(edges, config.get("top_k"))
    for r in range(40):
        previous = 0
        for d, token in enumerate(drafts[r].tolist()):
            expected = (torch.tensor(rows(d, previous), dtype=torch.float64) / TEMPERATURE).softmax(-1)
            q = scores[r, d].double().softmax(-1)
            assert torch.allclose(q[candidates[d]], expected, atol=1e-5), (r, d)
            assert float(q.index_fill(0, torch.tensor(candidates[d]), 0.0).max()) == 0.0  # nothing off them
            previous = candidates[d].index(token)
    counts = collections.Counter(tuple(row[:3]) for row in drafts.tolist())
    cells = [tuple(c) for c in itertools.product(*candidates[:3])]
    law = {cell: path_law(candidates, rows, cell, TEMPERATURE) for cell in cells}
    assert chi_square_pvalue(counts, law) > P_THRESHOLD
    unary_only = kept_rows([[u] * len(u) for u in unary], config.get("top_k"))
    wrong = {cell: path_law(candidates, unary_only, cell, TEMPERATURE) for cell in cells}
    assert chi_square_pvalue(counts, wrong) < P_THRESHOLD



# ----------------------------------------------------------------------------------------------------------------------
# generate(): lossless greedy (batch 1, batches, the default policy), the target's law when sampling, what is refused
@pytest.mark.parametrize("policy", ["full", "cost"])
def test_greedy_is_lossless_with_good_and_bad_drafters(target, drafter, policy):
    """Bad: the DFlash2 drafter's own walk (random weights); good: the oracle (the target's own continuation); noisy:
    the oracle with a share replaced. Under the default cost policy every path it can take is taken in turn."""
    prompt = make_prompt(11, seed=2)
    context = every_policy_path() if policy == "cost" else contextlib.nullcontext()
    with context:
        assert_lossless(target, drafter, prompt, max_new_tokens=40, assisted=dict(dflash_policy=policy))
    assert drafter.last_stats.num_verifications > 0


def test_greedy_batch_is_lossless_per_row(target, drafter):
    prompts = [make_prompt(n, seed=s) for n, s in ((7, 1), (12, 2), (9, 3))]
    ids, mask = left_padded(prompts)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
    fast = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0,
                           assistant_model=drafter, dflash_policy="full")
    assert torch.equal(plain, fast)
    assert len(drafter.last_stats.row_acceptance_lengths) == 3


def test_a_tree_is_refused_before_any_forward(target, drafter):
    with count_forwards(target, drafter) as counts, pytest.raises(ValueError, match="dflash_tree_budget.*DFlash2"):
        target.generate(make_prompt(6), assistant_model=drafter, max_new_tokens=8, dflash_tree_budget=8)
    assert counts == [0, 0]


LAW_VOCAB, NEW = 8, 3
SAMPLED_PROMPT = torch.tensor([[5, 4, 6, 7, 1, 2]])


@pytest.fixture(scope="module")
def law_pair():
    """A vocabulary-8 target with clearly non-uniform next-token laws and a DFlash2 drafter for it (K = 4 of 8)."""
    target = make_target("qwen3", vocab_size=LAW_VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, initializer_range=0.15, seed=0)
    drafter = make_dflash2(target, block_size=4, num_hidden_layers=1, target_layer_ids=(0,), selector_rank=4,
                           selector_scale=1.0)
    return target, drafter, exact_distribution(target, SAMPLED_PROMPT, NEW, temperature=TEMPERATURE)


def sampled_outputs(target, drafter, calls: int = 24, rows: int = 256):
    """`calls` generate calls on `rows` copies of the prompt: a Counter of their first NEW new tokens (of NEW + 3, so
    that the cycles that make them draft 3 tokens); the acceptance lengths."""
    counts, lengths = collections.Counter(), []
    ids = SAMPLED_PROMPT.expand(rows, -1)
    torch.manual_seed(0)
    for _ in range(calls):
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW + 3, do_sample=True,
                              temperature=TEMPERATURE, pad_token_id=0, assistant_model=drafter, dflash_policy="full")
        counts.update(tuple(row) for row in out[:, ids.shape[1] : ids.shape[1] + NEW].tolist())
        lengths += [a for row in drafter.last_stats.row_acceptance_lengths for a in row]
    return counts, lengths


def law_verdict(counts, law) -> float:
    """The smallest p-value of the joint of the NEW tokens and of each one's marginal, Bonferroni-corrected."""
    pvalues = [chi_square_pvalue(counts, law)]
    for i in range(NEW):
        marginal_counts, marginal_law = collections.Counter(), collections.defaultdict(float)
        for cell, n in counts.items():
            marginal_counts[cell[i]] += n
        for cell, p in law.items():
            marginal_law[cell[i]] += p
        pvalues.append(chi_square_pvalue(marginal_counts, marginal_law))
    return min(pvalues) * len(pvalues)


def test_sampling_with_the_selectors_q_follows_the_targets_law(law_pair):
    target, drafter, law = law_pair
    counts, lengths = sampled_outputs(target, drafter)
    assert lengths.count(3) > 0.05 * len(lengths) and lengths.count(1) > 0.05 * len(lengths)  # chains, rejections
    assert law_verdict(counts, law) > P_THRESHOLD


def test_sampling_with_a_wrong_q_is_caught(law_pair, monkeypatch):
    """Negative control: drafts from the selector's walk, but judged with q = softmax of the candidates' edge scores
    after candidate 0 at every position (the path ignored): the battery above must reject the output."""
    target, drafter, law = law_pair
    real = candidates_dflash.selector_walk

    def path_ignored(processors, histories, candidate_ids, edges, vocab_size, do_sample):
        drafts, scores = real(processors, histories, candidate_ids, edges, vocab_size, do_sample)
        wrong = torch.full_like(scores, float("-inf")).scatter_(2, candidate_ids, edges[:, :, 0] / TEMPERATURE)
        return drafts, wrong

    monkeypatch.setattr(candidates_dflash, "selector_walk", path_ignored)
    counts, _ = sampled_outputs(target, drafter)
    assert law_verdict(counts, law) < P_THRESHOLD


# ----------------------------------------------------------------------------------------------------------------------
# training: --variant dflash2
def test_selector_path_loss_is_the_true_paths_cross_entropy(target, drafter):
    """The selector's training loss against loops: at each supervised position, -log softmax(S[d, i*_{d-1}, :])[i*_d]
    over the top-K candidates (the label replacing the last one when outside them), zero where an earlier label of
    the block is unsupervised."""
    torch.manual_seed(0)
    steps, top_k = BLOCK - 1, drafter.config.selector_top_k
    drafts = torch.randn(1, 2, steps, 64)
    labels = torch.randint(0, 96, (1, 2, steps))
    labels[0, 1, 3] = IGNORE_INDEX  # block 2: position 4 unsupervised, so 5.. are off the known path
    block_ids = torch.tensor([[7] + [95] * steps + [9] + [95] * steps])
    batch = types.SimpleNamespace(labels=labels, block_ids=block_ids)
    losses = selector_path_losses(drafter, target.lm_head, drafts, batch, chunk_size=5)
    expected = []
    config = drafter.config
    for block, anchor in enumerate((7, 9)):
        previous_token, previous_index, on_path = anchor, 0, True
        for d in range(steps):
            label = int(labels[0, block, d])
            if label == IGNORE_INDEX:
                on_path = False
                continue
            logits = target.lm_head(drafts[0, block, d])
            candidates = logits.topk(top_k).indices.tolist()
            if label not in candidates:
                candidates[-1] = label
            z = logits[candidates] * config.output_multiplier
            unary = torch.tanh(z / config.final_logit_softcapping) * config.final_logit_softcapping
            projected = drafter.candidate_selector.hidden_projection(drafts[0, block, d])
            before = drafter.candidate_selector.predecessor_codebook[previous_token] * projected
            row = unary + drafter.candidate_selector.successor_codebook[candidates] @ before
            index = candidates.index(label)
            expected.append(float(-row.log_softmax(-1)[index]) if on_path else 0.0)
            previous_token, previous_index = label, index
    assert torch.allclose(losses, torch.tensor(expected), atol=1e-4), (losses, expected)


def test_dflash2_variant_trains_and_raises_generate_tau(workdir, data_file, target_and_tokenizer):
    """`hf-dflash train --variant dflash2` on the tiny target: the saved folder is a DFlash2 drafter, and its
    generate()-measured tau (drafting with the selector's walk) rises well above the untrained drafter's."""
    tiny, tokenizer = target_and_tokenizer
    args = small_args(data_file, workdir / "dflash2", variant="dflash2", epochs=3, eval_split=0.2,
                      num_eval_prompts=6, eval_max_new_tokens=32)
    trainer = DFlashTrainer(args, tiny, tokenizer)
    untrained = trainer.export_drafter(trainer.accelerator.get_state_dict(trainer.model))
    before = measure_acceptance_length(tiny, untrained, trainer.eval_prompt_ids(), 32)["tau"]
    results = trainer.train()
    config = json.loads((Path(args.output_dir) / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and "selector_top_k" in config["dflash_config"]
    trained = DFlashDraftModel.from_pretrained(args.output_dir)
    assert type(trained) is DFlash2DraftModel
    # the selector learned: its codebooks get gradients from the path loss only (measured: 1.0 -> 2.19; 1.92
    # without the path loss, whose codebooks then stay as initialised)
    for name in ("predecessor_codebook", "successor_codebook"):
        moved = getattr(trained.candidate_selector, name) - getattr(untrained.candidate_selector, name)
        assert moved.abs().max() > 0.05, name
    assert results["tau"] > before + 1.0, (before, results["tau"])
