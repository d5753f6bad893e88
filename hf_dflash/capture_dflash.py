# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Captured forwards: the target's verify forward compiled once per width (``torch.compile``; on CUDA, under
``mode="reduce-overhead"``, replayed as CUDA graphs) over a static cache, and the drafter's forward at one width over
a static cache of its own, so that a cycle costs what the hardware needs rather than what Python and kernel launches
cost.

Opt in with ``generate(..., assistant_model=drafter, dflash_compile=True)`` (a static cache is then made for the call
unless one is passed), or as transformers does for plain decoding: a ``compile_config`` on a device it compiles on
(CUDA and other accelerators, or any with ``compile_config._compile_all_devices``); ``disable_compile=True`` turns it
off. What runs captured: every verify forward of a batch of one on a chain (the drafter's drafts, prompt-lookup drafts
and the default policy's plain steps), at the widths of :func:`~timing_dflash.captured_widths` (a verify is padded up
to the next one; one that would not fit before the static cache's end runs eager), and the drafter's forward with its
new context padded to a block (:class:`CapturedDraft`). What stays eager: the prompt's prefill (one shape per prompt,
as in transformers), the drafter's read of a context wider than a block (the prompt; plain steps read at once),
batches (their padding mask grows), trees (their masks), targets with recurrent layers (their states are saved and
restored around a verify), drafters with sliding-window layers, and any forward the compiler cannot capture (a
warning says so, once per model).

Every graph compiled is counted, with the seconds its call took, in :class:`~stats_dflash.DFlashStats`
(``graphs_compiled``, ``compile_seconds``) and logged; a width compiled again for the same cache length (a recompile:
something the graph depends on changed) is a warning, never silent. Output never depends on it: a compiled forward
computes what the eager one does, so the verify's choices are the target's (tested against plain ``generate``).

Part of the remote-code payload: imports only torch, transformers and sibling modules.
"""

import contextlib
import time
import weakref

import torch
from torch import nn
from transformers import StaticCache
from transformers.utils import logging

from .cache_dflash import cache_argument, cache_capacity, static_refusal
from .options_dflash import DFlashCallOptions
from .timing_dflash import captured_widths

logger = logging.get_logger(__name__)

# torch.compile settings when the call gives no compile_config: one graph per width (fixed shapes: CUDA graphs replay
# them), the whole forward in it (a graph break would put Python back between kernels)
DEFAULT_SETTINGS = {"fullgraph": True, "dynamic": False, "backend": "inductor"}
# Graphs one target's forward may hold: dynamo keeps one per (width, cache length) on the forward's code, which
# transformers' own compiled decoding shares, and by default stops at 8 (under fullgraph, with an error); a call
# uses up to 6 widths and a process meets a few cache lengths (powers of two)
MOST_GRAPHS = 64
# devices transformers compiles plain decoding on, by default, with a static cache
COMPILING_DEVICES = ("cuda", "xpu", "neuron", "tpu", "mps")


def capture_requested(options: DFlashCallOptions, device: torch.device) -> bool:
    """Whether the call asks for captured forwards: ``dflash_compile=True``, or (when it says nothing) a
    ``compile_config`` on a device transformers would compile plain decoding on.

    Example:
        >>> capture_requested(DFlashCallOptions(compile=True), torch.device("cpu"))
        True
    """
    if options.compile is not None:
        return options.compile
    everywhere = bool(getattr(options.compile_config, "_compile_all_devices", False))
    return options.compile_config is not None and (everywhere or torch.device(device).type in COMPILING_DEVICES)


# the installed package's few-row CPU matrix kernels, a context manager over (target, drafter): set by its
# ``__init__`` (``hf_dflash.kernels_cpu.few_row_kernels``); a remote-code copy without the package has none
_CPU_KERNELS = {"context": None}


def use_cpu_kernels(context) -> None:
    """Make `context` (a context manager over ``(target, drafter)``, or None) what DFlash calls on a CPU run in."""
    _CPU_KERNELS["context"] = context


@contextlib.contextmanager
def forward_kernels(target, drafter, options: DFlashCallOptions | None):
    """The context a DFlash call's forwards run in: on a CPU, the installed package's few-row matrix kernel for the
    target's and the drafter's linear layers when the call asks for it (``dflash_cpu_kernels=True``, or None with
    ``HF_DFLASH_CPU_KERNELS=1``) and not for captured forwards (the compiler traces torch's own product); else
    torch's. While the kernel serves, the policy's costs go to tables of their own (the kernel sets
    :data:`~costs_dflash.FORWARD_KERNEL`). Yields whether it serves."""
    options = options if options is not None else DFlashCallOptions()
    context = _CPU_KERNELS["context"]
    if context is None or target.device.type != "cpu" or options.cpu_kernels is False or capture_requested(
            options, target.device):
        yield False
        return
    with context(target, drafter, enabled=options.cpu_kernels) as routed:
        yield bool(routed)


def compile_settings(options: DFlashCallOptions, device: torch.device) -> dict:
    """``torch.compile`` keyword arguments: those of the call's ``compile_config``, else :data:`DEFAULT_SETTINGS`
    with CUDA graphs (``mode="reduce-overhead"``) on CUDA."""
    if options.compile_config is not None:
        return options.compile_config.to_dict()
    mode = "reduce-overhead" if torch.device(device).type == "cuda" else "default"
    return {**DEFAULT_SETTINGS, "mode": mode}


def eager_reason(batch: int, trees: bool, recurrent: bool, cache, target=None) -> str | None:
    """Why a call that asked for captured forwards runs its verify eagerly (None: it is captured); a dynamic cache
    says why no static one was made for `target` where one cannot serve it (transformers 5.23, sliding windows)."""
    if batch > 1:
        return f"a batch of {batch} (its padding mask grows every cycle)"
    if trees:
        return "trees (their attention masks)"
    if recurrent:
        return "a target with recurrent layers (their states are saved and restored around a verify)"
    if cache_capacity(cache) is None:
        refusal = None if target is None else static_refusal(target)
        return "a dynamic cache" + ("" if refusal is None else f" ({refusal})")
    return None


# model -> (settings, the compiled call, the (width, cache length) pairs compiled for, whether capture failed)
_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class CapturedForward:
    """A model's forward, compiled (one per model and settings, shared by every call and kept with the model, as
    transformers keeps its compiled decoding call); `graphs` counts the graphs compiled during this call, and `stats`
    (the call's :class:`~stats_dflash.DFlashStats`) gets them with their seconds. `name` says which forward in logs."""

    def __init__(self, model, settings: dict, stats=None, name: str = "verify"):
        self.model, self.name = model, name
        entry = _COMPILED.get(model)
        if entry is None or entry["settings"] != settings:
            entry = _COMPILED[model] = {"settings": settings, "call": torch.compile(model.__call__, **settings),
                                        "compiled": set(), "failed": False}
        self.entry = entry
        self.cuda_graphs = settings.get("mode") in ("reduce-overhead", "max-autotune")
        self.graphs, self.stats = 0, stats
        self.compiled = False  # whether the last call compiled a graph (its seconds are not the forward's cost)

    @property
    def failed(self) -> bool:
        return self.entry["failed"]

    def run(self, width: int, cache_length: int, **inputs):
        """The model's outputs for `inputs` (eager when capture failed for this model); `width` and `cache_length`
        (the static cache's slots) name the graph in logs (a new one of either is a new graph)."""
        self.compiled = False
        if self.failed:
            return self.model(**inputs)
        before, start = graphs_compiled(), time.perf_counter()
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        try:
            limit = max(torch._dynamo.config.recompile_limit, MOST_GRAPHS)
            with torch._dynamo.config.patch(recompile_limit=limit):
                outputs = self.entry["call"](**inputs)
        except (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit) as error:
            self.entry["failed"] = True
            logger.warning(f"hf_dflash: the {self.name} forward could not be captured ({type(error).__name__}: "
                           f"{str(error).splitlines()[0]}); it runs eagerly for {type(self.model).__name__}.")
            return self.model(**inputs)
        new = graphs_compiled() - before
        if new:
            self._count(new, width, cache_length, time.perf_counter() - start)
        self.compiled = bool(new)
        return outputs

    def _count(self, new: int, width: int, cache_length: int, seconds: float) -> None:
        self.graphs += new
        if self.stats is not None:
            self.stats.graphs_compiled += new
            self.stats.compile_seconds += seconds
        key = (width, cache_length)
        if key in self.entry["compiled"]:
            logger.warning(f"hf_dflash: the captured {self.name} forward was compiled again at width {width} for a "
                           f"cache of {cache_length} slots ({seconds:.1f} s): something it depends on changed (see "
                           "TORCH_LOGS=recompiles).")
        else:
            logger.info(f"hf_dflash: captured the {self.name} forward at width {width} for a cache of {cache_length} "
                        f"slots ({seconds:.1f} s, once per width and cache length).")
        self.entry["compiled"].add(key)


class CapturedVerify(CapturedForward):
    """The target's verify forward, compiled. Call it as the target; `widths` are those it is captured at.

    Example:
        >>> verify = CapturedVerify(target, widest=16, settings=compile_settings(options, "cuda"))  # doctest: +SKIP
        >>> outputs = verify(cache_length, input_ids=ids, position_ids=positions, **forward_kwargs)  # doctest: +SKIP
    """

    def __init__(self, target, widest: int, settings: dict, stats=None):
        super().__init__(target, settings, stats)
        self.widths, self.settings = captured_widths(widest), settings

    def __call__(self, cache_length: int, **inputs):
        """The target's outputs for `inputs`; `cache_length`: the static cache's slots."""
        outputs = self.run(inputs["input_ids"].shape[1], cache_length, **inputs)
        return keep_outputs(outputs) if self.cuda_graphs and not self.failed else outputs


def drafter_capturable(drafter) -> bool:
    """Whether the drafter's forward can run captured (:class:`CapturedDraft`): not with sliding-window layers, whose
    window is built from a padding mask (they run eagerly, and a warning says so)."""
    if "sliding_attention" in (getattr(drafter.config, "layer_types", None) or []):
        logger.warning("hf_dflash: the drafter has sliding-window layers; its forward runs eagerly (the verify is "
                       "captured).")
        return False
    return True


class CapturedDraft(CapturedForward):
    """The drafter's forward at one shape, compiled, over its own static context cache (:attr:`cache`).

    Each cycle the drafter reads the context of the tokens committed since it last ran (1 to a block of them after a
    verify) and proposes a block. Padded to a block's width, that context always has one shape: the padding's slots
    are written after the real ones, masked, and given back with the block's (the cache's length rewound), so the next
    context overwrites them. Wider contexts (the prompt; the steps the default policy took plainly, read at once) run
    the same forward eagerly, on the same cache. The mask spans the cache's whole preallocated length, as a captured
    verify's does. Batches of one only (the captured verify's rule).

    Example:
        >>> draft = CapturedDraft(drafter, context_slots=4096, settings=compile_settings(options, "cuda"))  # doctest: +SKIP
        >>> hidden = draft(block_embeds, context, positions)  # doctest: +SKIP
    """

    def __init__(self, drafter, context_slots: int, settings: dict, stats=None):
        super().__init__(drafter, settings, stats, name="drafter")
        self.width = drafter.config.block_size
        self.slots = context_slots + 2 * self.width  # the context, then a padded context and the block at the end
        self.cache = StaticCache(config=drafter.config, max_cache_len=self.slots)
        # made before any forward, outside the graph (a short prompt's first read is captured): CUDA graphs need
        # the cache's tensors at fixed addresses
        config = drafter.config
        self.cache.early_initialization(1, config.num_key_value_heads, getattr(config, "head_dim", None)
                                        or config.hidden_size // config.num_attention_heads, drafter.dtype,
                                        drafter.device)
        self.keyword = cache_argument(drafter)
        self.length = 0  # slots holding context: the layers' length, kept on the host (reading it would sync)

    def __call__(self, block: torch.Tensor, context: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The drafter's last hidden states [1, q, H] for the `block` embeddings [1, q, H] after the fused `context`
        [1, n, C] (``DFlashDraftModel.fused_features``); `positions` [1, n + q]: the context's, then the block's."""
        n, q = context.shape[1], block.shape[1]
        width = self.width if n <= self.width else n  # wider: eager at its own width
        if self.length + width + q > self.slots:
            raise RuntimeError(f"The drafter's static cache is full ({self.slots} slots).")
        context = nn.functional.pad(context, (0, 0, 0, width - n))
        last = positions[:, max(n - 1, 0) : max(n, 1)]  # the padding's positions: any (masked)
        positions = torch.cat([positions[:, :n], last.expand(-1, width - n), positions[:, n:]], dim=1)
        slots = torch.arange(self.slots, device=block.device)
        end = self.length + width
        real = (slots < self.length + n) | ((slots >= end) & (slots < end + q))
        inputs = {"noise_embeds": block, "context_hidden_states": context, "position_ids": positions,
                  "attention_mask": real[None, None, None, :].expand(1, 1, q, -1), "context_fused": True,
                  self.keyword: self.cache}
        if width == self.width:
            hidden = self.run(width, self.slots, **inputs).last_hidden_state.clone()  # a replay overwrites it
        else:
            hidden, self.compiled = self.model(**inputs).last_hidden_state, False
        self.cache.crop(-(width - n + q))
        self.length += n
        return hidden


def graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process so far (a difference of two counts a call's compiles)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def keep_outputs(outputs):
    """`outputs` of a CUDA-graph replay copied out of the graph's memory, which the next replay overwrites (the loop
    keeps logits and hidden states past it)."""
    outputs.logits = outputs.logits.clone()
    if outputs.hidden_states is not None:
        outputs.hidden_states = tuple(h if h is None else h.clone() for h in outputs.hidden_states)
    return outputs
