# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The target's and the drafter's caches during DFlash decoding: which layer kinds a cache holds, the cache keyword of
a forward, row selection for finished batch rows, slot moves after a tree, the recurrent states a hybrid target
must rewind after a rejected draft, and (on a CPU) attention layers written in place.

Part of the remote-code payload: imports only torch and transformers.
"""

import dataclasses
import inspect

import torch
import transformers
from transformers import cache_utils
from transformers.cache_utils import DynamicCache, DynamicLayer


# Cache layers of hybrid targets (transformers 5.24): recurrent / convolution states that a verify forward advances
# through every draft. Older transformers have no such layers (isinstance against () is always False).
LINEAR_ATTENTION_LAYERS = getattr(cache_utils, "LinearAttentionCacheLayerMixin", ())
SLIDING_WINDOW_LAYERS = tuple(
    getattr(cache_utils, name) for name in ("DynamicSlidingWindowLayer", "StaticSlidingWindowLayer")
    if hasattr(cache_utils, name)
)
# Preallocated K/V layers of a StaticCache: [batch, heads, max_cache_len, head_dim], written in place at the layer's
# length; `crop(-n)` rewinds that length (transformers 5.24 on; 5.23's static layers cannot be cropped).
STATIC_LAYERS = getattr(cache_utils, "StaticLayer", ())


def cache_argument(model_or_output) -> str:
    """The cache's keyword for a model's forward or a generate output: `cache` from transformers 5.24 on (where
    `past_key_values` is deprecated, removed in 5.40), `past_key_values` before."""
    if isinstance(model_or_output, type) and dataclasses.is_dataclass(model_or_output):
        names = {f.name for f in dataclasses.fields(model_or_output)}
    else:
        names = set(inspect.signature(model_or_output.forward).parameters)
    return "cache" if "cache" in names else "past_key_values"


def cache_layers(cache) -> list:
    """The layers of `cache` (a cache without `layers` is its own single layer)."""
    return getattr(cache, "layers", None) or [cache]


def config_cache_layers(target) -> list:
    """The layers transformers would build for `target`'s cache ([] when it cannot build one from the config)."""
    try:
        return DynamicCache(config=target.config).layers
    except Exception:  # a cache transformers cannot build from this config
        return []


def holds_keys(layer) -> bool:
    """Whether a cache layer keeps attention K/V slots (hybrid layers keep them beside their linear states)."""
    return not isinstance(layer, LINEAR_ATTENTION_LAYERS) or hasattr(layer, "keys")


def is_recurrent(layer) -> bool:
    return isinstance(layer, LINEAR_ATTENTION_LAYERS)


def is_sliding_window(layer) -> bool:
    return isinstance(layer, SLIDING_WINDOW_LAYERS)


def is_static(layer) -> bool:
    return isinstance(layer, STATIC_LAYERS)


def static_layers(cache) -> list:
    """The preallocated (StaticCache) K/V layers of `cache`."""
    return [layer for layer in getattr(cache, "layers", ()) if is_static(layer)]


def select_cache_rows(cache, rows: torch.Tensor) -> None:
    """Keep only batch `rows` of every layer of `cache`, linear-attention (recurrent / conv) states included.

    A static layer has no row selection of its own: its preallocated K/V are selected the same way (new tensors of
    the same length, fewer rows), and its length, shared by every row, stays.
    """
    for layer in cache_layers(cache):
        if is_recurrent(layer):
            LINEAR_ATTENTION_LAYERS.reorder_cache(layer, rows)  # index_select of its states over the batch
        if is_static(layer) and not hasattr(layer, "batch_select_indices"):
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[rows.to(layer.device)], layer.values[rows.to(layer.device)]
                layer.batch_size = len(rows)
        elif holds_keys(layer):
            layer.batch_select_indices(rows)


def cache_slots(cache) -> int | None:
    """Slots the target's cache holds (None for a cache of recurrent layers only, which has no slots: the loop needs
    the count only to lay out padding masks, and such a target is run with none in the middle). A static cache keeps
    its length in a tensor; it is read as an int here."""
    if any(holds_keys(layer) for layer in cache_layers(cache)):
        return int(cache.get_seq_length())
    return None


def cache_capacity(cache) -> int | None:
    """The most slots `cache` can hold: the smallest `max_cache_len` of its static layers (None: it grows).

    Example:
        >>> cache_capacity(DynamicCache()) is None
        True
    """
    lengths = [layer.max_cache_len for layer in static_layers(cache)]
    return min(lengths) if lengths else None


def free_slots(cache, cached: int) -> int | None:
    """Slots left after the `cached` ones before a verify block would run past a static cache's end (None: no end)."""
    capacity = cache_capacity(cache)
    return None if capacity is None else capacity - cached


def key_width(cache, cached: int, width: int) -> int:
    """Keys the target's attention reads in a forward of `width` tokens after `cached` slots: all the preallocated
    slots of a static cache (the unwritten ones must be masked), else the cached slots and the block.

    Example:
        >>> key_width(DynamicCache(), cached=5, width=3)
        8
    """
    capacity = cache_capacity(cache)
    return cached + width if capacity is None else capacity


def compact_slots(caches, slot_mask: torch.Tensor, unread: int) -> torch.Tensor:
    """Squeeze the padding slots out of a batch's caches: each row's real slots (True in `slot_mask` [b, S]) among the
    first `S - unread` move, in order, to the end of a prefix as long as the row with the most of them (the others
    are left-padded), and the last `unread` slots (verified, but not yet read by the drafter, whose cache lacks them)
    follow it. Returns the new slot mask.

    `caches` are the target's cache (S slots) and the drafter's (S - unread slots), which share the slot layout. Keys
    carry their rotary positions already, and a softmax over keys does not depend on their order, so attention is
    unchanged; a static cache needs it when a batch's rejected drafts and finished neighbours would otherwise fill it.

    Example:
        >>> cache = DynamicCache()
        >>> keys = torch.arange(4.0).reshape(1, 1, 4, 1).repeat(2, 1, 1, 1)
        >>> _ = cache.update(keys, keys.clone(), 0)
        >>> compact_slots([cache], torch.tensor([[True, False, True, True], [False, False, True, True]]), 1).tolist()
        [[True, True, True], [False, True, True]]
        >>> cache.layers[0].keys[:, 0, :, 0].tolist()  # row 1's first slot (padding) holds whatever was there
        [[0.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    """
    total = slot_mask.shape[1]
    prefix = slot_mask[:, : total - unread]
    kept = prefix.sum(-1)
    longest = int(kept.max())
    # a stable sort puts each row's padding slots first and its real slots after them, in order
    order = torch.sort(prefix.to(torch.int8), dim=1, stable=True).indices[:, prefix.shape[1] - longest :]
    index = torch.cat([order, torch.arange(total - unread, total, device=order.device).expand(len(order), -1)], dim=1)
    mask = torch.cat([torch.arange(longest, device=kept.device)[None] >= (longest - kept)[:, None],
                      slot_mask[:, total - unread :]], dim=1)
    for cache in caches:
        held = cache_slots(cache) or 0
        for layer in cache_layers(cache):
            if holds_keys(layer) and layer.is_initialized and layer.keys.numel() > 0:
                move_slots(layer, index[:, : index.shape[1] - (total - held)], held)
    return mask


def move_slots(layer, index: torch.Tensor, held: int) -> None:
    """Make the slots `index` [b, n] (per row) of a K/V `layer` holding `held` slots its first n, and crop it there."""
    gathered = []
    for states in (layer.keys, layer.values):
        rows = index.to(states.device)[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[-1])
        gathered.append(states[:, :, :held].gather(2, rows))
    if not is_static(layer):
        layer.keys, layer.values = gathered
        return
    layer.keys[:, :, : index.shape[1]], layer.values[:, :, : index.shape[1]] = gathered  # in place: a fixed address
    layer.crop(-(held - index.shape[1]))


def has_sliding_window(cache) -> bool:
    """Whether some layer of the target's cache keeps only a window of recent tokens (Mistral, Gemma, gpt-oss...)."""
    return any(is_sliding_window(layer) for layer in getattr(cache, "layers", ()))


def keep_path_slots(cache, cached: int, rows: torch.Tensor) -> None:
    """Move the K/V of verify-block rows `rows` (the anchor and the accepted path of a tree, ascending) to the front
    of the block in every layer of `cache`, in place (a static layer's preallocated K/V too); the caller then crops the
    rest of the block (a static layer: rewinds its length)."""
    for layer in cache_layers(cache):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or keys.numel() == 0:
            continue
        index = (cached + rows).to(keys.device)
        keys[..., cached : cached + len(rows), :] = keys.index_select(-2, index)
        values[..., cached : cached + len(rows), :] = values.index_select(-2, index)


class RecurrentStates:
    """The recurrent states of a hybrid target's cache (Qwen3.5 / Qwen3-Next Gated DeltaNet, Mamba layers of
    Falcon-H1 or GraniteMoeHybrid...), and how the loop brings them back to the accepted prefix.

    A verify forward folds every draft into them. From transformers 5.25 on, a cache that records its past keeps
    the state after each of the forward's last tokens, and cropping the cache rewinds them too (`crop_rewinds`):
    nothing more to do. Before 5.25, K/V and convolution states can be cropped back but a recurrent state cannot:
    the states are saved before each verify forward, and after a partial acceptance the loop restores them, crops
    the rest of the cache to before the verify block, and re-advances the target through the committed tokens only
    (one extra target forward over accepted + 1 tokens; none when every draft was accepted).

    Example:
        >>> bool(RecurrentStates(DynamicCache()))  # a plain attention cache holds no recurrent state
        False
    """

    def __init__(self, cache):
        self.layers = [layer for layer in getattr(cache, "layers", ()) if is_recurrent(layer)]
        self.crop_rewinds = records_recurrent_history(cache)
        self.saved: list[dict] = []

    def __bool__(self) -> bool:
        return any(any(layer.is_recurrent_states_initialized.values()) for layer in self.layers)

    def save(self) -> None:
        self.saved = [{i: state.clone() for i, state in layer.recurrent_states.items() if state is not None}
                      for layer in self.layers]

    def restore(self) -> None:
        for layer, saved in zip(self.layers, self.saved):
            for i, state in saved.items():
                layer.recurrent_states[i].copy_(state)  # in place: the cache keeps its tensors' addresses


def records_recurrent_history(cache) -> bool:
    """Whether `cache` can keep the recurrent state after each token of a forward, so that `crop` rewinds it
    (transformers 5.25 on)."""
    return hasattr(cache, "get_recurrent_states_to_keep")


class GrowingLayer(DynamicLayer):
    """A :class:`~transformers.cache_utils.DynamicLayer` whose keys and values live in buffers with room for
    :attr:`GROWTH` more slots: a forward writes its new slots in place, and ``keys`` / ``values`` are views of the
    slots written. transformers' layer concatenates the whole cache at every forward instead: every cached key and
    value copied into newly allocated memory, per layer per forward (SmolLM2-135M on a CPU after a 4K-token prompt,
    plain steps only: 127 ms a token with it, 99 ms in place). Attention reads the same values in the same order:
    the logits are bit for bit those of transformers' layer.

    A crop is a shorter view from the buffers' start; keys or values replaced from outside (row selection, slot
    moves, offloading) are copied into new buffers at the next update. A buffer holds at most `most_slots` (the
    call's need, when known) until a forward writes past them (a batch's padding slots can), then grows as without.

    Example:
        >>> layer = GrowingLayer()
        >>> keys = torch.arange(6.0).reshape(1, 1, 6, 1)
        >>> _ = layer.update(keys[:, :, :4], keys[:, :, :4])
        >>> buffer = layer.keys.data_ptr()
        >>> layer.crop(-2)
        >>> _ = layer.update(keys[:, :, 4:], keys[:, :, 4:])
        >>> layer.keys[0, 0, :, 0].tolist(), layer.keys.data_ptr() == buffer  # written in place
        ([0.0, 1.0, 4.0, 5.0], True)
    """

    GROWTH = 256  # slots a new buffer holds beyond those written (~3% of the cache after 8K tokens)
    most_slots: int | None = None  # the slots the call can reach (None: unknown): room is made up to them

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held = self.keys.shape[-2] if self.keys.dim() == key_states.dim() else 0
        end = held + key_states.shape[-2]
        buffers = getattr(self, "_buffers", None)
        if buffers is None or not self._views(buffers) or end > buffers[0].shape[-2]:
            buffers = self._buffers = tuple(self._grown(old, new, held, end) for old, new in
                                            ((self.keys, key_states), (self.values, value_states)))
        for buffer, new in zip(buffers, (key_states, value_states)):
            buffer[..., held:end, :] = new
        self.keys, self.values = (buffer[..., :end, :] for buffer in buffers)
        return self.keys, self.values

    def _views(self, buffers) -> bool:
        """Whether ``keys`` and ``values`` are still the first slots of `buffers` (nobody replaced them)."""
        return all(states.data_ptr() == buffer.data_ptr() and states.stride() == buffer.stride()
                   and states.shape[:-2] == buffer.shape[:-2]
                   for states, buffer in zip((self.keys, self.values), buffers))

    def _grown(self, old: torch.Tensor, new: torch.Tensor, held: int, end: int) -> torch.Tensor:
        """A buffer for `end` slots and :attr:`GROWTH` more, holding the `held` slots of `old`."""
        room = end + self.GROWTH
        if self.most_slots is not None and end <= self.most_slots:  # (past it, e.g. a batch's padding: grow again)
            room = min(room, self.most_slots)
        buffer = new.new_empty((*new.shape[:-2], room, new.shape[-1]))
        if held:
            buffer[..., :held, :] = old
        return buffer


def grow_in_place(cache, most_slots: int | None = None) -> None:
    """Make `cache`'s plain attention layers not written yet (transformers' ``DynamicLayer``, exactly: not the
    sliding-window or recurrent kinds) :class:`GrowingLayer` s that make room for at most `most_slots` (None: no
    bound), keeping whatever the cache set on them.

    Example:
        >>> cache = DynamicCache()
        >>> grow_in_place(cache)
        >>> _ = cache.update(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), 0)
        >>> type(cache.layers[0]).__name__
        'GrowingLayer'
    """
    for layer in getattr(cache, "layers", ()):
        if type(layer) is DynamicLayer and not layer.is_initialized:
            layer.__class__ = GrowingLayer  # same attributes: the layer the cache built, buffered
            layer.most_slots = most_slots
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:  # a cache that adds layers as it meets them
        cache.layer_class_to_replicate = GrowingLayer


def empty_target_cache(target, model_kwargs: dict, block_size: int, max_length: int | None = None, batch: int = 1,
                       static: bool = False):
    """The caller's cache (which must be empty) or a new DynamicCache, recording its past so that sliding-window
    layers, and from transformers 5.25 on the recurrent states of a verify block of up to `block_size` tokens, can
    be cropped back. A static cache (``cache_implementation="static"``, or a StaticCache passed in) is checked
    (:func:`check_static_cache`); one that ``generate`` made too short for a batch is made again longer. `static`
    (captured forwards want one): a dynamic cache ``generate`` made becomes a static one where the target's layers
    allow it (not sliding-window or recurrent ones: those stay dynamic, and eager)."""
    cache = model_kwargs.get("past_key_values", model_kwargs.get("cache"))  # `cache` from transformers 5.24 on
    if cache is None:
        cache = DynamicCache(config=target.config)
    if cache_slots(cache) or RecurrentStates(cache):
        raise ValueError("A pre-filled past_key_values is not supported with a DFlash drafter; pass the full prompt.")
    needed, capacity = static_slots_needed(max_length, batch, block_size), cache_capacity(cache)
    made_by_generate = not getattr(cache, "_is_user_defined", False)
    too_short = capacity is not None and needed is not None and capacity < needed
    made_static = capacity is None and needed is not None and static and static_serves(target)
    if made_by_generate and (too_short or made_static):
        # a static cache made here is rounded up: captured forwards compile one graph per cache length, so calls of
        # other lengths share them
        length = max(256, 1 << (needed - 1).bit_length()) if made_static else needed
        cache = cache_utils.StaticCache(config=target.config.get_text_config(decoder=True), max_cache_len=length)
    check_static_cache(cache, needed)
    if target.device.type == "cpu":  # (measured there; GPUs keep transformers' layers)
        # a call writes at most max_length - 1 slots and a verify block past them
        grow_in_place(cache, None if max_length is None else max_length + block_size)
    if records_recurrent_history(cache):
        cache.activate_past_recording(recurrent_states_to_keep=block_size)
    elif hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def static_slots_needed(max_length: int | None, batch: int, block_size: int) -> int | None:
    """Slots a static target cache needs for a call: ``max_length - 1``, as plain ``generate`` sizes it; a batch also
    a block more, for the padding slots of drafts a row rejected while a neighbour accepted more, which the drafter
    has not read yet (the others are squeezed out: :func:`compact_slots`).

    Example:
        >>> static_slots_needed(64, batch=1, block_size=16), static_slots_needed(64, batch=4, block_size=16)
        (63, 79)
    """
    if max_length is None:
        return None
    return max_length - 1 + (block_size if batch > 1 else 0)


def static_serves(target) -> bool:
    """Whether a static cache can serve `target` with a DFlash drafter (:func:`check_static_cache` passes)."""
    return static_refusal(target) is None


def static_refusal(target) -> str | None:
    """Why a static cache cannot serve `target` with a DFlash drafter here (:func:`check_static_cache`'s reason,
    without its fix), None when it can."""
    try:
        check_static_cache(cache_utils.StaticCache(config=target.config.get_text_config(decoder=True),
                                                   max_cache_len=1), None)
    except ValueError as error:
        return str(error).split(";")[0]
    return None


def check_static_cache(cache, needed: int | None) -> None:
    """A static target cache must rewind a rejected draft by cropping its length: each case it cannot serve raises a
    ValueError naming the fix (drop ``cache_implementation="static"``: the dynamic cache serves them all).

    Example:
        >>> check_static_cache(DynamicCache(), needed=63)  # not static: nothing to check
    """
    static = static_layers(cache)
    if not static:
        return
    fix = "drop cache_implementation=\"static\" (or the StaticCache) to decode on the dynamic cache"
    if not callable(getattr(static[0], "crop", None)):
        raise ValueError(f"A static cache with a DFlash drafter needs transformers >= 5.24, whose static layers can be "
                         f"cropped back after a rejected draft (this is {transformers.__version__}); upgrade, or "
                         f"{fix}.")
    if any(is_recurrent(layer) for layer in cache.layers):
        raise ValueError("A static cache with a hybrid (recurrent / convolution) target is not supported with a DFlash "
                         f"drafter: its recurrent states are rolled back on the dynamic cache only; {fix}.")
    if any(is_sliding_window(layer) for layer in static):
        raise ValueError("A static cache with a sliding-window target is not supported with a DFlash drafter: its "
                         "window layers drop the tokens that leave the window, so a rejected draft's slots cannot be "
                         f"given back; {fix}.")
    capacity = cache_capacity(cache)
    if needed is not None and capacity < needed:
        raise ValueError(f"The static cache holds max_cache_len={capacity} slots but this call needs {needed} "
                         "(max_length - 1, and a batch a block of the drafter's more); pass a StaticCache with "
                         f"max_cache_len >= {needed}, or lower max_new_tokens, or {fix}.")
