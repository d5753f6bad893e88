# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Captured forwards: the target's verify forward compiled once per width (``torch.compile``; on CUDA, under
``mode="reduce-overhead"``, replayed as CUDA graphs) over a static cache, so that a cycle costs what the hardware
needs rather than what Python and kernel launches cost.

Opt in with ``generate(..., assistant_model=drafter, dflash_compile=True)`` (a static cache is then made for the call
unless one is passed), or as transformers does for plain decoding: a ``compile_config`` on a device it compiles on
(CUDA and other accelerators, or any with ``compile_config._compile_all_devices``); ``disable_compile=True`` turns it
off. What runs captured: every verify forward of a batch of one on a chain (the drafter's drafts, prompt-lookup drafts
and the default policy's plain steps), at the widths of :func:`~timing_dflash.captured_widths` (a verify is padded up
to the next one; one that would not fit before the static cache's end runs eager). What stays eager: the prompt's
prefill (one shape per prompt, as in transformers), the drafter's forward (its context cache grows every cycle),
batches (their padding mask grows), trees (their masks), targets with recurrent layers (their states are saved and
restored around a verify), and any forward the compiler cannot capture (a warning says so, once per target).

Every graph compiled is counted, with the seconds its call took, in :class:`~stats_dflash.DFlashStats`
(``graphs_compiled``, ``compile_seconds``) and logged; a width compiled again for the same cache length (a recompile:
something the graph depends on changed) is a warning, never silent. Output never depends on it: a compiled forward
computes what the eager one does, so the verify's choices are the target's (tested against plain ``generate``).

Part of the remote-code payload: imports only torch, transformers and sibling modules.
"""

import time
import weakref

import torch
from transformers.utils import logging

from .cache_dflash import cache_capacity
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


def compile_settings(options: DFlashCallOptions, device: torch.device) -> dict:
    """``torch.compile`` keyword arguments: those of the call's ``compile_config``, else :data:`DEFAULT_SETTINGS`
    with CUDA graphs (``mode="reduce-overhead"``) on CUDA."""
    if options.compile_config is not None:
        return options.compile_config.to_dict()
    mode = "reduce-overhead" if torch.device(device).type == "cuda" else "default"
    return {**DEFAULT_SETTINGS, "mode": mode}


def eager_reason(batch: int, trees: bool, recurrent: bool, cache) -> str | None:
    """Why a call that asked for captured forwards runs its verify eagerly (None: it is captured)."""
    if batch > 1:
        return f"a batch of {batch} (its padding mask grows every cycle)"
    if trees:
        return "trees (their attention masks)"
    if recurrent:
        return "a target with recurrent layers (their states are saved and restored around a verify)"
    if cache_capacity(cache) is None:
        return "a dynamic cache"
    return None


# target -> (settings, the compiled call, the (width, cache length) pairs compiled for, whether capture failed)
_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class CapturedVerify:
    """The target's verify forward, compiled (one per target and settings, shared by every call and kept with the
    target, as transformers keeps its compiled decoding call). Call it as the target; `widths` are those it is
    captured at; `graphs` counts the graphs compiled during this call, and `stats` (the call's
    :class:`~stats_dflash.DFlashStats`) gets them with their seconds.

    Example:
        >>> verify = CapturedVerify(target, widest=16, settings=compile_settings(options, "cuda"))  # doctest: +SKIP
        >>> outputs = verify(input_ids=ids, position_ids=positions, **forward_kwargs)  # doctest: +SKIP
    """

    def __init__(self, target, widest: int, settings: dict, stats=None):
        self.target, self.widths = target, captured_widths(widest)
        entry = _COMPILED.get(target)
        if entry is None or entry["settings"] != settings:
            entry = _COMPILED[target] = {"settings": settings, "call": torch.compile(target.__call__, **settings),
                                         "compiled": set(), "failed": False}
        self.entry = entry
        self.cuda_graphs = settings.get("mode") in ("reduce-overhead", "max-autotune")
        self.graphs, self.stats = 0, stats

    @property
    def failed(self) -> bool:
        return self.entry["failed"]

    def __call__(self, cache_length: int, **inputs):
        """The target's outputs for `inputs` (eager when capture failed for this target); `cache_length`: the static
        cache's slots (a new length is a new graph)."""
        if self.failed:
            return self.target(**inputs)
        before, start = graphs_compiled(), time.perf_counter()
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        try:
            limit = max(torch._dynamo.config.recompile_limit, MOST_GRAPHS)
            with torch._dynamo.config.patch(recompile_limit=limit):
                outputs = self.entry["call"](**inputs)
        except (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit) as error:
            self.entry["failed"] = True
            logger.warning(f"hf_dflash: the target's verify forward could not be captured ({type(error).__name__}: "
                           f"{str(error).splitlines()[0]}); it runs eagerly for {type(self.target).__name__}.")
            return self.target(**inputs)
        new = graphs_compiled() - before
        if new:
            self._count(new, inputs["input_ids"].shape[1], cache_length, time.perf_counter() - start)
        return keep_outputs(outputs) if self.cuda_graphs else outputs

    def _count(self, new: int, width: int, cache_length: int, seconds: float) -> None:
        self.graphs += new
        if self.stats is not None:
            self.stats.graphs_compiled += new
            self.stats.compile_seconds += seconds
        key = (width, cache_length)
        if key in self.entry["compiled"]:
            logger.warning(f"hf_dflash: the captured verify forward was compiled again at width {width} for a cache of "
                           f"{cache_length} slots ({seconds:.1f} s): something it depends on changed (see "
                           "TORCH_LOGS=recompiles).")
        else:
            logger.info(f"hf_dflash: captured the verify forward at width {width} for a cache of {cache_length} "
                        f"slots ({seconds:.1f} s, once per width and cache length).")
        self.entry["compiled"].add(key)


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
