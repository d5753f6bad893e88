# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Peak tensor memory of a call, counted exactly: every storage an operator allocates, from its allocation until the
last tensor viewing it is gone.

The resident set size of a process (what ``benchmarks/long_context_costs.py --memory`` reads) is the number users see,
but on a CPU it moves with the allocator's arenas and what was loaded before; this counts the tensors themselves, so
two calls compare to the byte and a test can hold a bound on what a call keeps alive.

Example:
    >>> import torch
    >>> with PeakTensorMemory() as memory:
    ...     a = torch.ones(1024)          # 4 KiB
    ...     b = a * 2                     # 4 KiB more, both alive
    ...     del a, b
    ...     c = torch.ones(256)
    >>> memory.peak_bytes
    8192
"""

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class PeakTensorMemory(TorchDispatchMode):
    """A dispatch mode that counts the bytes of the tensor storages operators allocate inside it: `live_bytes` now,
    `peak_bytes` the most at any moment, `allocated_bytes` all it allocated (what a call copies), and (with `snapshot`) `largest_at_peak`, (nbytes, shape) of the largest
    storages alive then. Storages that
    existed before (weights, the caller's inputs) are not counted."""

    def __init__(self, snapshot: bool = False) -> None:
        super().__init__()
        self.snapshot = snapshot  # keep `largest_at_peak` (costs a sort at every new peak)
        self.live_bytes = self.peak_bytes = self.allocated_bytes = 0
        self.largest_at_peak: list[tuple[int, tuple[int, ...]]] = []
        self._live: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._refs: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func._schema.is_mutable:
            return out  # a view of, or a write into, storages it was given: counted when they were made, or outside
        given = {storage_key(t) for t in tree_flatten((args, kwargs))[0] if is_dense(t)}
        for tensor in tree_flatten(out)[0]:
            if is_dense(tensor) and storage_key(tensor) not in given:
                self._count(tensor)
        return out

    def _count(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or key in self._live:
            return
        self._live[key] = (nbytes, tuple(tensor.shape))
        # torch keeps one Python object per storage while the storage lives: its weak reference dies with the storage
        self._refs[key] = weakref.ref(storage, lambda _, key=key: self._free(key))
        self.live_bytes += nbytes
        self.allocated_bytes += nbytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            if self.snapshot:
                self.largest_at_peak = sorted(self._live.values(), reverse=True)[:8]

    def _free(self, key: int) -> None:
        nbytes, _ = self._live.pop(key, (0, ()))
        self._refs.pop(key, None)
        self.live_bytes -= nbytes


def is_dense(value) -> bool:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


def storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()
