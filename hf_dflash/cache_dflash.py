# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The target's and the drafter's caches during DFlash decoding: which layer kinds a cache holds, the cache keyword of
a forward, row selection for finished batch rows, slot moves after a tree, and the recurrent states a hybrid target
must rewind after a rejected draft.

Part of the remote-code payload: imports only torch and transformers.
"""

import dataclasses
import inspect

import torch
from transformers import cache_utils
from transformers.cache_utils import DynamicCache


# Cache layers of hybrid targets (transformers 5.24): recurrent / convolution states that a verify forward advances
# through every draft. Older transformers have no such layers (isinstance against () is always False).
LINEAR_ATTENTION_LAYERS = getattr(cache_utils, "LinearAttentionCacheLayerMixin", ())
SLIDING_WINDOW_LAYERS = tuple(
    getattr(cache_utils, name) for name in ("DynamicSlidingWindowLayer", "StaticSlidingWindowLayer")
    if hasattr(cache_utils, name)
)


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


def select_cache_rows(cache, rows: torch.Tensor) -> None:
    """Keep only batch `rows` of every layer of `cache`, linear-attention (recurrent / conv) states included."""
    for layer in cache_layers(cache):
        if is_recurrent(layer):
            LINEAR_ATTENTION_LAYERS.reorder_cache(layer, rows)  # index_select of its states over the batch
        if holds_keys(layer):
            layer.batch_select_indices(rows)


def cache_slots(cache) -> int | None:
    """Slots the target's cache holds (None for a cache of recurrent layers only, which has no slots: the loop needs
    the count only to lay out padding masks, and such a target is run with none in the middle)."""
    if any(holds_keys(layer) for layer in cache_layers(cache)):
        return cache.get_seq_length()
    return None


def has_sliding_window(cache) -> bool:
    """Whether some layer of the target's cache keeps only a window of recent tokens (Mistral, Gemma, gpt-oss...)."""
    return any(is_sliding_window(layer) for layer in getattr(cache, "layers", ()))


def keep_path_slots(cache, cached: int, rows: torch.Tensor) -> None:
    """Move the K/V of verify-block rows `rows` (the anchor and the accepted path of a tree, ascending) to the front
    of the block in every layer of `cache`; the caller then crops the rest of the block."""
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


def empty_target_cache(target, model_kwargs: dict, block_size: int):
    """The caller's cache (which must be empty) or a new DynamicCache, recording its past so that sliding-window
    layers, and from transformers 5.25 on the recurrent states of a verify block of up to `block_size` tokens, can
    be cropped back."""
    cache = model_kwargs.get("past_key_values", model_kwargs.get("cache"))  # `cache` from transformers 5.24 on
    if cache is None:
        cache = DynamicCache(config=target.config)
    if cache_slots(cache) or RecurrentStates(cache):
        raise ValueError("A pre-filled past_key_values is not supported with a DFlash drafter; pass the full prompt.")
    if records_recurrent_history(cache):
        cache.activate_past_recording(recurrent_states_to_keep=block_size)
    elif hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache
