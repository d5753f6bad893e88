# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The prompt's features, written once: the drafter's context for a long prompt, filled layer by layer as the
target's prefill forward runs, and for a DFlash drafter projected through its ``fc`` as each layer finishes.

Asking the target for ``output_hidden_states`` keeps each selected layer's [b, n, H] output in a tuple until the
forward ends, and :func:`target_features` then concatenates them into a new [b, n, T*H] tensor: for
a moment the prompt's features are held twice (188 MiB at 8K tokens for SmolLM2-135M's five layers in fp32). Here a
forward hook on each selected decoder layer copies its output into its slice of one tensor allocated at the first
hook, and the layer's own output is freed as the forward goes on, as in plain decoding. The hooks sit on modules a
server's other threads may be running at the same moment, so they write only for the thread that entered the writer.

Given the drafter's ``fc`` (DFlash: a linear map of the T concatenated layers to one hidden state), each layer's
output is projected by its own slice of ``fc`` and summed into one [b, n, H] tensor (:func:`fuse_layer`): the prompt's
context then takes one hidden state per token instead of T (87 MiB -> 17 MiB at 8K tokens for SmolLM2-135M). The
decoding loop fuses every later verify's features the same way (:func:`fuse_states`), in the same order, so the
drafter reads the same numbers whichever path made them; a verify's are fused when the drafter reads them, together
with those of the plain steps before (``Rows.unread``), so a run of plain steps never pays for ``fc``.

Part of the remote-code payload: imports only torch and transformers.

Example:
    >>> writer = PromptFeatureWriter.for_target(target, drafter.config.target_layer_ids)  # doctest: +SKIP
    >>> with writer:  # doctest: +SKIP
    ...     outputs = target(input_ids=ids, use_cache=True)
    >>> writer.features.shape  # doctest: +SKIP
    torch.Size([1, 8192, 2880])
    >>> writer = PromptFeatureWriter.for_target(target, drafter.config.target_layer_ids, drafter.fc)  # doctest: +SKIP
    >>> with writer:  # doctest: +SKIP
    ...     outputs = target(input_ids=ids, use_cache=True)
    >>> writer.features.shape  # the drafter's fused context  # doctest: +SKIP
    torch.Size([1, 8192, 576])
"""

import threading

import torch
from torch import nn


def decoder_layers(target) -> nn.ModuleList | None:
    """The target's decoder layers, in the order ``hidden_states[1:]`` numbers their outputs, or None where they are
    not the usual ``get_decoder().layers`` of the text config's depth (the caller then asks for hidden states)."""
    decoder = target.get_decoder() if hasattr(target, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    if not isinstance(layers, nn.ModuleList) or len(layers) != getattr(config, "num_hidden_layers", -1):
        return None
    return layers


def fuse_layer(weight: torch.Tensor, k: int, hidden: torch.Tensor, fused: torch.Tensor | None) -> torch.Tensor:
    """`fused` plus the k-th selected layer's share of ``fc`` (`weight` [H, T*H]) applied to its output `hidden`
    [b, n, H], in `weight`'s dtype and on its device: summed over the T layers in layer order it is ``fc`` of their
    concatenation, up to rounding.

    Example:
        >>> weight = torch.ones(2, 4)
        >>> fused = fuse_layer(weight, 0, torch.ones(1, 1, 2), None)
        >>> fuse_layer(weight, 1, torch.full((1, 1, 2), 2.0), fused).tolist()
        [[[6.0, 6.0]]]
    """
    hidden = hidden.to(device=weight.device, dtype=weight.dtype)
    width = hidden.shape[-1]
    share = nn.functional.linear(hidden, weight[:, k * width : (k + 1) * width])
    return share if fused is None else fused.add_(share)


def fuse_states(states: list[torch.Tensor], layer_ids: list[int], fc: nn.Module | None) -> torch.Tensor:
    """The drafter's context of the target's `states` after layers `layer_ids` (one [b, n, H] each): ``fc`` of their
    concatenation [b, n, H], each layer's share summed in the order the target's layers run, as
    :class:`PromptFeatureWriter` sums a prompt's; without an `fc` (DFlare), the concatenation [b, n, T*H].

    Example:
        >>> fc = nn.Linear(4, 2, bias=False); _ = fc.weight.data.fill_(1.0)
        >>> fuse_states([torch.ones(1, 1, 2), torch.full((1, 1, 2), 2.0)], [3, 1], fc).tolist()
        [[[6.0, 6.0]]]
    """
    if fc is None:
        return torch.cat(states, dim=-1)
    fused, weight = None, dense_weight(fc)
    for k in sorted(range(len(layer_ids)), key=layer_ids.__getitem__):
        fused = fuse_layer(weight, k, states[k], fused)
    return fused


def target_features(hidden_states, layer_ids) -> torch.Tensor:
    """The drafter's context: the target's hidden states after layers `layer_ids` (output of layer k is
    ``hidden_states[k + 1]``), concatenated on the feature axis: [b, n, T*H]. Training and inference both call this,
    so the drafter is trained on exactly what it reads at inference.

    Example:
        >>> states = [torch.full((1, 2, 3), float(i)) for i in range(4)]  # embeddings, then layers 0, 1, 2
        >>> target_features(states, [0, 2])[0, 0].tolist()
        [1.0, 1.0, 1.0, 3.0, 3.0, 3.0]
    """
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def dense_weight(linear: nn.Module) -> torch.Tensor:
    """`linear`'s weight as a plain tensor: a quantized ``fc`` (``torch.ao`` dynamic quantization: its weight is a
    method returning a quantized tensor) dequantized."""
    weight = linear.weight() if callable(linear.weight) else linear.weight
    return weight.dequantize() if weight.is_quantized else weight


class PromptFeatureWriter:
    """Forward hooks on the decoder layers `layer_ids` that write layer k's output into slice k of `features`, one
    [b, n, len(layer_ids) * H] tensor (the layout of :func:`target_features`), or, given the
    drafter's `fc`, add its projection into one [b, n, H] tensor (:func:`fuse_layer`), while inside a ``with`` block.
    Build it with :meth:`for_target`."""

    def __init__(self, layers: list[nn.Module], fc: nn.Linear | None = None):
        self.layers = layers
        self.weight = None if fc is None else dense_weight(fc)
        self.features: torch.Tensor | None = None
        self._handles: list = []
        self._thread: int | None = None

    @classmethod
    def for_target(cls, target, layer_ids: list[int], fc: nn.Linear | None = None) -> "PromptFeatureWriter | None":
        """A writer for `target`'s layers `layer_ids` (projected through the drafter's `fc` when given), or None where
        hooks cannot stand in for ``hidden_states``: its layers are not found, or the last layer is selected
        (transformers returns that one after the final norm)."""
        layers = decoder_layers(target)
        if layers is None or max(layer_ids) >= len(layers) - 1:
            return None
        return cls([layers[i] for i in layer_ids], fc)

    def __enter__(self) -> "PromptFeatureWriter":
        self.features = None
        self._thread = threading.get_ident()
        self._handles = [layer.register_forward_hook(self._writer(k)) for k, layer in enumerate(self.layers)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _writer(self, k: int):
        def write(module, args, output):
            if threading.get_ident() != self._thread:  # another thread's forward through the same layers
                return None
            hidden = output[0] if isinstance(output, tuple) else output
            if self.weight is not None:
                self.features = fuse_layer(self.weight, k, hidden, self.features)
                return None
            if self.features is None:
                batch, length, width = hidden.shape
                self.features = hidden.new_empty(batch, length, len(self.layers) * width)
            width = hidden.shape[-1]
            self.features[..., k * width : (k + 1) * width].copy_(hidden)

        return write
