# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The prompt's features, written once: the drafter's context for a long prompt, [b, n, T*H], filled layer by layer
as the target's prefill forward runs.

Asking the target for ``output_hidden_states`` keeps each selected layer's [b, n, H] output in a tuple until the
forward ends, and :func:`~modeling_dflash.target_features` then concatenates them into a new [b, n, T*H] tensor: for
a moment the prompt's features are held twice (188 MiB at 8K tokens for SmolLM2-135M's five layers in fp32). Here a
forward hook on each selected decoder layer copies its output into its slice of one tensor allocated at the first
hook, and the layer's own output is freed as the forward goes on, as in plain decoding. The hooks sit on modules a
server's other threads may be running at the same moment, so they write only for the thread that entered the writer.

Part of the remote-code payload: imports only torch and transformers.

Example:
    >>> writer = PromptFeatureWriter.for_target(target, drafter.config.target_layer_ids)  # doctest: +SKIP
    >>> with writer:  # doctest: +SKIP
    ...     outputs = target(input_ids=ids, use_cache=True)
    >>> writer.features.shape  # doctest: +SKIP
    torch.Size([1, 8192, 2880])
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


class PromptFeatureWriter:
    """Forward hooks on the decoder layers `layer_ids` that write layer k's output into slice k of `features`, one
    [b, n, len(layer_ids) * H] tensor (the layout of :func:`~modeling_dflash.target_features`), while inside a
    ``with`` block. Build it with :meth:`for_target`."""

    def __init__(self, layers: list[nn.Module]):
        self.layers = layers
        self.features: torch.Tensor | None = None
        self._handles: list = []
        self._thread: int | None = None

    @classmethod
    def for_target(cls, target, layer_ids: list[int]) -> "PromptFeatureWriter | None":
        """A writer for `target`'s layers `layer_ids`, or None where hooks cannot stand in for ``hidden_states``: its
        layers are not found, or the last layer is selected (transformers returns that one after the final norm)."""
        layers = decoder_layers(target)
        if layers is None or max(layer_ids) >= len(layers) - 1:
            return None
        return cls([layers[i] for i in layer_ids])

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
            if self.features is None:
                batch, length, width = hidden.shape
                self.features = hidden.new_empty(batch, length, len(self.layers) * width)
            width = hidden.shape[-1]
            self.features[..., k * width : (k + 1) * width].copy_(hidden)

        return write
