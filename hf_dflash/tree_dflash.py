# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Tree verification for DFlash drafters (DDTree): more drafts per target forward, same output.

Part of the remote-code payload: imports only torch, transformers and the standard library.

``target.generate(..., assistant_model=drafter, dflash_tree_budget=N)`` replaces steps 3-5 of a DFlash cycle
(:func:`~generation_dflash.dflash_decoding`) by:
  3. tree: from the drafter's ONE forward (its distribution q_d at every block position d), build a tree of at most
     N draft nodes best-first by joint draft probability (a node at depth d extends its parent with one of the top
     tokens of position d; priority = product of q along the path), and verify the anchor and every node in ONE
     target forward: each node attends to the cache and to its ancestors only, at position anchor + depth;
  4. accept the longest path the target accepts: greedy: follow the child equal to the target's own choice;
     sampling: multi-draft rejection sampling over each node's children (see :func:`sample_path`); then the
     target's own next token at the path's end;
  5. commit that path: its K/V slots are moved to the front of the verify block in the target's cache and the rest
     is cropped; its target features are the drafter's next context; stopping criteria cut it exactly where plain
     ``generate`` would.
Without a budget (None) a cycle verifies the chain of the drafter's choices, as before.

Sampling: the children of a node at depth d are drawn WITHOUT replacement from q_d (the drafter's processed
distribution at that position; fresh Gumbel noise per node), so child i was drawn from q_d restricted to the tokens
its older siblings did not take, renormalised. The tree's SHAPE is fixed before any token is drawn (from the sorted
values of q_d, by rank), so it never depends on which tokens were drawn: each acceptance step is an exact rejection
sampler and the committed tokens follow the target's distribution exactly (recursive rejection sampling).

Limits (each raises a ValueError before any work): batch size 1 only; full-attention targets only (hybrid/recurrent
and sliding-window targets verify chains); ``sdpa`` or ``eager`` attention (the tree mask is a 4D mask).
"""

import heapq
import math
from dataclasses import dataclass

import torch

from .cache_dflash import cache_slots, free_slots, keep_path_slots, key_width
from .lookup_dflash import prompt_lookup
from .rows_dflash import record
from .sampling_dflash import vectorizable
from .timing_dflash import gemm_friendly_rows, synchronized_clock


# ----------------------------------------------------------------------------------------------------------------------
# building the tree
@dataclass
class DraftTree:
    """Node 0 is the anchor (depth 0); nodes 1..n are drafts, parents before children, siblings in proposal order.

    `tokens` [n + 1] (tokens[0] is the anchor), `parents` (parents[0] = -1), `depths` (depth d drafts block position
    d), `children[i]`: node i's children in the order they are tried, `fixed[i]`: node i was not drawn from the
    drafter but proposed deterministically (the n-gram branch; q is a point mass on its token).
    """

    tokens: torch.Tensor
    parents: list[int]
    depths: list[int]
    children: list[list[int]]
    fixed: list[bool] = None
    log_probs: list[float] = None  # per drafted node: the drafter's joint log-probability of its path (best first)

    def __post_init__(self):
        if self.fixed is None:
            self.fixed = [False] * len(self.parents)

    def __len__(self) -> int:
        return len(self.parents)

    def add_branch(self, tokens: list[int]) -> int:
        """Add the path `tokens` from the anchor, sharing the existing nodes of its longest prefix already in the tree;
        new nodes are fixed proposals, tried after their drafted siblings. Returns how many nodes were added.

        Example:
            >>> tree = DraftTree(torch.tensor([9, 4, 5]), [-1, 0, 1], [0, 1, 2], [[1], [2], []])
            >>> tree.add_branch([4, 6, 7]), tree.parents, tree.tokens.tolist(), tree.fixed
            (2, [-1, 0, 1, 1, 3], [9, 4, 5, 6, 7], [False, False, False, True, True])
        """
        node, new = 0, []
        for token in tokens:
            same = next((c for c in self.children[node] if int(self.tokens[c]) == token), None)
            if same is None:
                same = len(self.parents)
                self.parents.append(node)
                self.depths.append(self.depths[node] + 1)
                self.children[node].append(same)
                self.children.append([])
                self.fixed.append(True)
                new.append(token)
            node = same
        if new:
            self.tokens = torch.cat([self.tokens, self.tokens.new_tensor(new)])
        return len(new)

    def ancestors(self) -> torch.Tensor:
        """[n + 1, n + 1] booleans: node i sees node j (j is i or one of its ancestors)."""
        n = len(self)
        seen = torch.zeros(n, n, dtype=torch.bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                seen[i] = seen[parent]
            seen[i, i] = True
        return seen.to(self.tokens.device)

    def paths(self) -> list[list[int]]:
        """Draft tokens from the anchor (excluded) to node i (included), per node."""
        tokens, out = self.tokens.tolist(), []
        for i, parent in enumerate(self.parents):
            out.append([] if parent < 0 else out[parent] + [tokens[i]])
        return out


def tree_shape(ranked_log_probs: list[list[float]], budget: int):
    """Best-first tree shape (DDTree) from `ranked_log_probs[d][j]`, the log draft probability of the rank-j token at
    block position d + 1 (sorted, descending; -inf: no such token).

    A node at depth d + 1 extends its parent with the rank-j token of position d + 1; its priority is the sum of
    log-probabilities along its path. Popping the best frontier node adds it and pushes its first child and its next
    sibling, so every node's children are its ranks 0, 1, ... in order. Returns (parents, depths, ranks), node 0
    being the anchor.

    Example (two positions; the second-ranked token of position 1 beats the path through position 2):
        >>> tree_shape([[-0.1, -1.0], [-2.0, -3.0]], budget=3)
        ([-1, 0, 0, 1], [0, 1, 1, 2], [0, 0, 1, 0])
    """
    parents, depths, ranks = [-1], [0], [0]
    scores = [0.0]
    positions = len(ranked_log_probs)
    frontier, counter = [], 0
    if positions and ranked_log_probs[0] and ranked_log_probs[0][0] > float("-inf"):
        frontier.append((-ranked_log_probs[0][0], counter, 0, 0))  # (-priority, order, parent, rank)
    while frontier and len(parents) <= budget:
        negative, _, parent, rank = heapq.heappop(frontier)
        node, depth = len(parents), depths[parent] + 1
        parents.append(parent)
        depths.append(depth)
        ranks.append(rank)
        scores.append(-negative)
        row = ranked_log_probs[depth - 1]
        if rank + 1 < len(row) and row[rank + 1] > float("-inf"):  # next sibling
            counter += 1
            heapq.heappush(frontier, (-(scores[parent] + row[rank + 1]), counter, parent, rank + 1))
        if depth < positions and ranked_log_probs[depth][0] > float("-inf"):  # first child
            counter += 1
            heapq.heappush(frontier, (-(scores[node] + ranked_log_probs[depth][0]), counter, node, 0))
    return parents, depths, ranks


def build_tree(anchor: torch.Tensor, draft_scores: torch.Tensor, budget: int, do_sample: bool) -> DraftTree:
    """The tree of at most `budget` drafts from the drafter's processed scores `draft_scores` [k, V] (position d + 1 of
    the block in row d; q_d = softmax).

    Greedy: the rank-j child at depth d is the j-th most probable token of q_d. Sampling: a node's children are
    drawn without replacement from q_d (Gumbel top-c, fresh noise per node); the shape does not depend on the draw.
    """
    log_q = draft_scores.float().log_softmax(-1)
    width = min(budget, log_q.shape[-1])
    ranked, tokens_by_rank = log_q.topk(width, dim=-1)
    ranked = ranked.tolist()
    parents, depths, ranks = tree_shape(ranked, budget)
    n = len(parents)
    log_probs = [0.0]
    for node in range(1, n):
        log_probs.append(log_probs[parents[node]] + ranked[depths[node] - 1][ranks[node]])
    children = [[] for _ in range(n)]
    for node in range(1, n):
        children[parents[node]].append(node)
    tokens = anchor.reshape(1).expand(n).clone()
    if n > 1:
        nodes = torch.arange(1, n)
        depth_rows = torch.tensor(depths[1:]) - 1
        rank_cols = torch.tensor(ranks[1:])
        if not do_sample:
            tokens[1:] = tokens_by_rank.cpu()[depth_rows, rank_cols].to(tokens.device)
        else:
            fathers = [i for i in range(n) if children[i]]
            rows = log_q[torch.tensor([depths[i] for i in fathers], device=log_q.device)]  # q of their children
            gumbel = -torch.empty_like(rows).exponential_().log()
            drawn = (rows + gumbel).topk(max(len(children[i]) for i in fathers), dim=-1).indices.cpu()
            slot = {father: j for j, father in enumerate(fathers)}
            father_rows = torch.tensor([slot[parents[i]] for i in nodes.tolist()])
            tokens[1:] = drawn[father_rows, rank_cols].to(tokens.device)
    return DraftTree(tokens, parents, depths, children, log_probs=log_probs)


# ----------------------------------------------------------------------------------------------------------------------
# accepting a path
def greedy_path(tree: DraftTree, target_scores: torch.Tensor):
    """Greedy: from the anchor, follow the child equal to the target's choice (argmax of `target_scores` [n + 1, V],
    row i: the scores after node i). Returns (path nodes after the anchor, the target's token after the last)."""
    choice, tokens = target_scores.argmax(-1).tolist(), tree.tokens.tolist()
    node, path = 0, []
    while True:
        nxt = next((c for c in tree.children[node] if tokens[c] == choice[node]), None)
        if nxt is None:
            return path, choice[node]
        path.append(nxt)
        node = nxt


def sample_path(tree: DraftTree, draft_probs: torch.Tensor, target_probs: torch.Tensor):
    """Sampling: multi-draft rejection sampling down the tree. Returns (path nodes, the token after the last).

    At node i with target distribution p (row i of `target_probs` [n + 1, V]), its children c_1, c_2, ... were drawn
    without replacement from q = `draft_probs`[depth] ([k, V]): c_j from q_j = q restricted to the tokens c_1..c_{j-1}
    did not take, renormalised. Accept c_j with probability min(1, p(c_j) / q_j(c_j)) and descend; on rejection
    p <- norm(max(0, p - q_j)) and try c_{j+1}; when every child is rejected (or there is none) the token after the
    path is drawn from p. A fixed child (n-gram branch, tried after the drafted ones) has q_j = a point mass on its
    token. Each step is an exact rejection sampler whose proposal depends only on earlier proposals, so the path and
    its last token follow the target.
    """
    tokens = tree.tokens.tolist()
    node, path = 0, []
    while True:
        p = target_probs[node]
        kids = tree.children[node]
        if kids:
            drafted = not all(tree.fixed[c] for c in kids)
            q = draft_probs[tree.depths[node]].clone() if drafted else None
            u = torch.rand(len(kids), device=p.device).tolist()
            accepted = None
            for j, child in enumerate(kids):
                token = tokens[child]
                if tree.fixed[child]:  # q_j is a point mass on the token: accept with p(token), else p without it
                    if u[j] < float(p[token]):
                        accepted = child
                        break
                    residual = p.clone()
                    residual[token] = 0.0
                else:
                    q_j = q / q.sum()
                    if u[j] * float(q_j[token]) < float(p[token]):  # u < p / q_j, without dividing by q_j
                        accepted = child
                        break
                    residual = (p - q_j).clamp_min(0)
                total = residual.sum()
                p = residual / total if total > 0 else p  # rounding may empty it
                if not tree.fixed[child]:
                    q[token] = 0.0  # the next drafted sibling was drawn from the tokens this one did not take
            if accepted is not None:
                path.append(accepted)
                node = accepted
                continue
        return path, int(torch.multinomial(p / p.sum(), 1))


# ----------------------------------------------------------------------------------------------------------------------
# processed target scores per node, and the cache
def tree_scores(processors, history: torch.Tensor, tree: DraftTree, logits: torch.Tensor) -> torch.Tensor:
    """Processed target scores per node: row i was computed after `history` + the drafts on node i's path.

    One processor call for the whole tree when :func:`~sampling_dflash.vectorizable` (position-independent warpers,
    repetition penalty: paths are padded with the anchor, which the history holds); otherwise one call per node with
    its exact history, as plain ``generate`` makes them.
    """
    if len(processors) == 0:
        return logits
    paths = tree.paths()
    if vectorizable(processors, [history]):
        longest = max(len(p) for p in paths)
        anchor = int(history[-1])
        tails = torch.tensor([p + [anchor] * (longest - len(p)) for p in paths], dtype=history.dtype,
                             device=history.device).reshape(len(paths), longest)
        ids = torch.cat([history[None].expand(len(paths), -1), tails], dim=1)
        return processors(ids, logits.clone())
    out = torch.empty_like(logits)
    for i, path in enumerate(paths):
        ids = torch.cat([history, torch.tensor(path, dtype=history.dtype, device=history.device)])[None]
        out[i : i + 1] = processors(ids, logits[i : i + 1].clone())
    return out


def tree_attention_mask(tree: DraftTree, slot_mask, cached: int, width: int, dtype, attention: str,
                        keys: int | None = None) -> torch.Tensor:
    """[1, 1, width, keys] mask of a verify block of the tree's nodes (then `width - len(tree)` padding rows that see
    the cache and themselves): every row sees the real cache slots and its ancestors. `keys` is what the attention
    reads (:func:`~cache_dflash.key_width`): ``cached + width`` (the default), or a static cache's whole length, whose
    slots after the block are masked. Booleans (True: attend) for sdpa, additive floats for eager attention.

    Example (a chain of one draft after 2 cached slots, in a static cache of 6):
        >>> tree = DraftTree(torch.tensor([7, 8]), [-1, 0], [0, 1], [[1], []])
        >>> tree_attention_mask(tree, None, 2, 2, torch.float32, "sdpa", keys=6)[0, 0].int().tolist()
        [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    """
    device = tree.tokens.device
    n = len(tree)
    block = torch.eye(width, dtype=torch.bool, device=device)
    block[:n, :n] = tree.ancestors()
    before = slot_mask.to(device) if slot_mask is not None else torch.ones(1, cached, dtype=torch.bool, device=device)
    after = torch.zeros(width, (keys or cached + width) - cached - width, dtype=torch.bool, device=device)
    mask = torch.cat([before.bool().expand(width, -1), block, after], dim=1)[None, None]
    if attention == "eager":
        return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, torch.finfo(dtype).min)
    return mask


class _Committed:
    """The parts of a verify forward's outputs that the output recorder reads, in the order of the committed path."""

    def __init__(self, outputs, rows: torch.Tensor, cached: int):
        hidden = getattr(outputs, "hidden_states", None)
        self.hidden_states = None if hidden is None else tuple(None if h is None else h[:, rows] for h in hidden)
        attentions = getattr(outputs, "attentions", None)
        self.attentions = None
        if attentions is not None:
            keys = torch.cat([torch.arange(cached, device=rows.device), cached + rows])
            self.attentions = tuple(a[..., rows, :][..., keys] for a in attentions)


# ----------------------------------------------------------------------------------------------------------------------
# one cycle
class TreeVerifier:
    """Steps 3-5 of a DFlash cycle over a tree of drafts (batch 1), for :func:`dflash_decoding`.

    The call's `options` give the most nodes (``tree_budget``), the n-gram branch (``branch_tokens``) and whether it
    samples (``do_sample``); the draft `policy` cuts each tree to the budget it chooses from the node probabilities
    and is told each tree cycle's costs and acceptance. The drafter's next context comes from
    ``drafter.target_features``. The call was checked (:func:`~checks_dflash.check_tree_call`) before any work.

    Example:
        >>> out = target.generate(ids, assistant_model=drafter, dflash_tree_budget=16)  # doctest: +SKIP
    """

    def __init__(self, target, drafter, forward_kwargs, logits_processor, stopping_criteria, options, policy):
        self.target, self.drafter, self.forward_kwargs = target, drafter, forward_kwargs
        self.options, self.policy = options, policy
        self.logits_processor, self.stopping_criteria = logits_processor, stopping_criteria
        self.attention = getattr(target.config, "_attn_implementation", "sdpa")

    def cycle(self, rows, cache, draft_scores, stats, recorder, streamer, draft_seconds: float) -> list[int]:
        """Verify a tree built from `draft_scores` [1, k, V] for the one row of `rows`, commit the accepted path and
        tell the policy the cycle's costs (the drafter's `draft_seconds` included). Returns the rows that go on (as
        ``Rows.commit``)."""
        device = draft_scores.device
        tic = synchronized_clock(device)
        history = rows.histories[0]
        tree = build_tree(history[-1], draft_scores[0], self.options.tree_budget, self.options.do_sample)
        # the best b-node tree is the first b nodes of the best-first one; its shape never depends on the draws
        budget = self.policy.tree_budget(tree.log_probs, batch=1, device=device)
        chosen = budget.count
        cached = cache_slots(cache)
        free = free_slots(cache, cached)
        branch = self.branch_length(history)
        if free is not None:  # a static cache ends: the anchor, the nodes and the n-gram branch must fit before it
            chosen = max(min(chosen, free - 1 - branch), 0)
        if chosen < len(tree) - 1:
            tree = build_tree(history[-1], draft_scores[0], chosen, self.options.do_sample)
        expected = sum(math.exp(p) for p in tree.log_probs[1:])
        if branch:  # the n-gram branch
            tree.add_branch(prompt_lookup(history, branch, self.options.lookup_ngram))
        n = len(tree)
        width = gemm_friendly_rows(n, device, most=free)
        if free is None or budget.rows <= free:  # a wider verify measured cheaper (an n-gram branch may outgrow it)
            width = max(width, budget.rows)
        ids = torch.cat([tree.tokens, tree.tokens[:1].expand(width - n)])[None]
        depths = torch.tensor(tree.depths + [0] * (width - n), device=ids.device)
        positions = rows.anchor_positions[:, None] + depths[None]
        dtype = self.target.get_input_embeddings().weight.dtype
        mask = tree_attention_mask(tree, rows.slot_mask, cached, width, dtype, self.attention,
                                   keys=key_width(cache, cached, width))
        outputs = self.target(
            input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=0, **self.forward_kwargs
        )
        raw = outputs.logits[0, :n].float()
        processed = tree_scores(self.logits_processor, history, tree, raw)
        if self.options.do_sample:
            path, last = sample_path(tree, draft_scores[0].float().softmax(-1), processed.softmax(-1))
        else:
            path, last = greedy_path(tree, processed)

        kept = torch.tensor([0] + path, device=ids.device)
        rest = torch.tensor([i for i in range(width) if i not in set(kept.tolist())], dtype=torch.long,
                            device=ids.device)
        order = torch.cat([kept, rest])  # every verified slot, the path first: commit crops the cache after the path
        keep_path_slots(cache, cached, kept)
        accepted = torch.tensor([len(path)], device=ids.device)
        stats.add_verification(rows.ids, accepted, num_drafts=n - 1)
        tokens = torch.cat([tree.tokens[kept[1:]], tree.tokens.new_tensor([last])])[None]
        running, committed = rows.commit(
            accepted, tokens, processed[kept][None], self.drafter.selected_states(outputs.hidden_states, kept),
            positions[:, order], cache, cached, self.stopping_criteria,
        )
        record(recorder, streamer, _Committed(outputs, kept, cached), raw[kept][None], processed[kept][None],
               committed, cached)
        seconds = synchronized_clock(device) - tic  # the target's share, commit included, as a chain cycle's
        stats.verify_seconds += seconds
        self.policy.observe_costs(1, device, width, seconds, draft_seconds)
        self.policy.observe_tree(expected, len(path))
        return running

    def branch_length(self, history) -> int:
        """Tokens of the n-gram branch after `history` (0: none), as many as fit under max_length."""
        if not self.options.branch_tokens:
            return 0
        room = self.options.room(len(history))
        return self.options.branch_tokens if room is None else max(min(self.options.branch_tokens, room), 0)
