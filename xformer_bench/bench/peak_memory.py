"""Peak memory of what a piece of code allocates.

On CUDA, ``torch.cuda.max_memory_allocated`` above what was allocated before.  On CPU, where
PyTorch keeps no such statistic, :class:`PeakLiveBytes` watches every tensor an operation
returns inside it and tracks the bytes of the storages still alive (a storage is counted once
however many views share it, and released when its last view dies): the peak of the
activations, gradients and temporaries the code made -- not its inputs or parameters.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakLiveBytes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}  # a view or an in-place result allocates none
        for leaf in tree_leaves(out):
            if not isinstance(leaf, torch.Tensor) or leaf.device.type == "meta":
                continue
            storage = leaf.untyped_storage()
            key = id(storage)
            if key in self._seen or key in inputs:
                continue
            self._seen.add(key)
            nbytes = storage.nbytes()
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._release, key, nbytes)
        return out


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated while ``fn()`` runs (what it returns is dropped at once)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with PeakLiveBytes() as tracker:
        fn()
    return tracker.peak
