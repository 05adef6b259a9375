"""Host synchronisations, caught on a CPU: the operations that, on a GPU, make the host wait for
the device (CUDA's ``torch.cuda.set_sync_debug_mode`` class of warnings), each with the
innermost ``xformer_bench`` source line that caused it.

At the ATen level (a :class:`~torch.utils._python_dispatch.TorchDispatchMode`, which also sees
the backward pass and the optimiser):

- ``aten._local_scalar_dense``: ``.item()``, ``bool(t)`` / ``if t:``, ``int(t)``, ``float(t)``,
  ``torch.arange(t)``, any Python number read from a tensor;
- data-dependent output shapes: ``nonzero`` (``torch.where(mask)``, ``argwhere``),
  ``masked_select``, ``unique`` (``_unique2``, ``unique_dim``, ``unique_consecutive``),
  ``repeat_interleave`` with a tensor of repeats and no ``output_size``, ``bincount``
  (its length is the largest value), ``histc`` without a range, indexing or index assignment
  with a boolean mask (``x[mask]``, ``x[mask] = v``: ``index`` / ``index_put`` do a nonzero);
- ops that return a Python value: ``equal``, ``allclose``, ``is_nonzero``;
- a device-to-host copy (``_to_copy`` / ``copy_`` from a non-CPU tensor to the CPU; on a GPU).

At the Python level, for what a CPU tensor does without an ATen op (a no-op ``.cpu()``, a
``.tolist()`` that reads memory directly): ``Tensor.tolist``, ``Tensor.numpy``, ``Tensor.cpu``
and ``Tensor.to("cpu")`` are wrapped while recording.

``with recording_host_syncs() as syncs: ...`` leaves in ``syncs`` one ``(op, where)`` per
synchronising call, ``where`` = ``"xformer_bench/path.py:LINE function"``: the innermost frame
outside the libraries (torch, Lightning, the standard library) -- a line of the package, or of a
test -- with ``" via torch/optim/...:LINE function"`` when a library made the call, and
``"backward of <Node> <- "`` before it for an op of autograd's own backward formulas.
:func:`location` shortens it to the ``"path:function"`` that declarations name."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PACKAGE = Path(__import__("xformer_bench").__file__).resolve().parent
HERE = Path(__file__).resolve()
TORCH = Path(torch.__file__).resolve().parent
LIBRARIES = (TORCH.parent, Path(traceback.__file__).resolve().parent)
"""site-packages (torch, Lightning, pytest) and the standard library."""
MACHINERY = (HERE, TORCH / "_dynamo", TORCH / "_compile.py", TORCH / "_ops.py",
             TORCH / "utils" / "_python_dispatch.py")
"""Frames of the recording itself, innermost on every recorded stack."""

aten = torch.ops.aten

ALWAYS_SYNC = {
    aten._local_scalar_dense.default: "item",  # .item(), bool(), int(), float(), if t:
    aten.is_nonzero.default: "is_nonzero",
    aten.equal.default: "equal",
    aten.allclose.default: "allclose",
    aten.nonzero.default: "nonzero",
    aten.nonzero_numpy.default: "nonzero",
    aten.argwhere.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten._unique.default: "unique",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique_consecutive",
    aten.unique_dim_consecutive.default: "unique_consecutive",
    aten.bincount.default: "bincount",
}
"""ATen overloads that synchronise however they are called -> the name they are listed under."""

REPEAT_INTERLEAVE = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
            aten._index_put_impl_.default, aten._unsafe_index.Tensor}
COPIES = {aten._to_copy.default, aten.copy_.default}


def _is_bool_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in (torch.bool, torch.uint8)


def sync_name(func, args: tuple, kwargs: dict) -> str | None:
    """The name a host-synchronising call of ``func`` is listed under, None when it is not one."""
    if func in ALWAYS_SYNC:
        return ALWAYS_SYNC[func]
    if func in REPEAT_INTERLEAVE:
        output_size = kwargs.get("output_size", args[-1] if len(args) > 3 else None)
        return None if output_size is not None else "repeat_interleave (no output_size)"
    if func in INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(_is_bool_tensor(i) for i in indices if i is not None):
            return "boolean-mask indexing" if func is aten.index.Tensor else \
                "boolean-mask index_put"
        return None
    if func is aten.histc.default:
        lo = args[2] if len(args) > 2 else kwargs.get("min", 0)
        hi = args[3] if len(args) > 3 else kwargs.get("max", 0)
        return "histc (no range)" if lo == hi else None
    if func in COPIES:
        source = args[1] if func is aten.copy_.default else args[0]
        target = args[0].device if func is aten.copy_.default else kwargs.get("device")
        if isinstance(source, torch.Tensor) and source.device.type != "cpu" and \
                target is not None and torch.device(target).type == "cpu":
            return "device-to-host copy"
    return None


def _frame(entry: traceback.FrameSummary) -> str:
    path = Path(entry.filename).resolve()
    for root in (*LIBRARIES, PACKAGE.parent):
        if path.is_relative_to(root):
            path = path.relative_to(root)
            break
    else:
        path = Path(path.name)
    return f"{path}:{entry.lineno} {entry.name}"


def _in_libraries(entry: traceback.FrameSummary) -> bool:
    path = Path(entry.filename).resolve()
    return "<" in entry.filename or any(path.is_relative_to(lib) for lib in LIBRARIES)


def _machinery(entry: traceback.FrameSummary) -> bool:
    path = Path(entry.filename).resolve()
    return any(path.is_relative_to(m) for m in MACHINERY)


def where(stack: list[traceback.FrameSummary] | None = None) -> str:
    """Where an op was called from: the innermost frame of ``stack`` (the caller's, by
    default) outside the libraries -- an ``xformer_bench`` line, ``"xformer_bench/path.py:LINE
    function"``, or a test's -- followed by ``" via LIBRARY_FRAME"`` when a library made the
    call (``torch/optim/adamw.py:...``), after ``"backward of NODE <- "`` when autograd's own
    backward formulas ran it (no frame of ours on the stack but the ``backward()`` call)."""
    stack = traceback.extract_stack() if stack is None else stack
    while stack and _machinery(stack[-1]):
        stack = stack[:-1]
    innermost = stack[-1] if stack else None
    via = f" via {_frame(innermost)}" if innermost is not None and _in_libraries(innermost) else ""
    ours = next((_frame(e) for e in reversed(stack) if not _in_libraries(e)), "?")
    node = torch._C._current_autograd_node()
    in_backward = node is not None and not any(
        Path(e.filename).resolve().is_relative_to(PACKAGE) for e in stack)
    return (f"backward of {type(node).__name__} <- " if in_backward else "") + ours + via


def location(at: str) -> str:
    """``"path:function"`` of a :func:`where` string (line numbers move with edits): its
    ``xformer_bench`` frame, else the library frame that made the call, else the caller's."""
    frame = at.split(" <- ")[-1]
    package, _, library = frame.partition(" via ")
    frame = package if package.startswith("xformer_bench/") or not library else library
    path_line, function = frame.split(" ", 1)
    return f"{path_line.rsplit(':', 1)[0]}:{function}"


class _SyncRecorder(TorchDispatchMode):
    def __init__(self, syncs: list[tuple[str, str]]):
        super().__init__()
        self.syncs = syncs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = sync_name(func, args, kwargs)
        if name is not None:
            self.syncs.append((name, where()))
        return func(*args, **kwargs)


def _wrapped(method, name: str, syncs: list, when):
    def wrapper(self, *args, **kwargs):
        if when(self, *args, **kwargs):
            syncs.append((name, where()))
        return method(self, *args, **kwargs)
    return wrapper


def _to_cpu(self, *args, **kwargs) -> bool:
    """``Tensor.to`` whose target is written as the CPU (``"cpu"``, ``device="cpu"``): a copy to
    the host on a GPU.  (``.to(x.device)`` is a CPU device here but follows the data there.)"""
    target = kwargs.get("device", args[0] if args else None)
    return isinstance(target, str) and target.startswith("cpu")


def _always(*args, **kwargs) -> bool:
    return True


PYTHON_LEVEL = (("tolist", "tolist", _always), ("numpy", "numpy", _always),
                ("cpu", "cpu()", _always), ("to", "to('cpu')", _to_cpu))
"""(Tensor method, name it is listed under, whether a call synchronises)."""


@contextmanager
def recording_host_syncs() -> Iterator[list[tuple[str, str]]]:
    """Record every host-synchronising call made inside the block (forward, backward,
    optimiser): yields the list that fills with ``(op, where)``."""
    syncs: list[tuple[str, str]] = []
    originals = {attr: getattr(torch.Tensor, attr) for attr, _, _ in PYTHON_LEVEL}
    for attr, name, when in PYTHON_LEVEL:
        setattr(torch.Tensor, attr, _wrapped(originals[attr], name, syncs, when))
    try:
        with _SyncRecorder(syncs):
            yield syncs
    finally:
        for attr, method in originals.items():
            setattr(torch.Tensor, attr, method)


def summary(syncs: list[tuple[str, str]]) -> list[str]:
    """``"op at where (xN)"`` per distinct offender, in the order first met."""
    counts: dict[tuple[str, str], int] = {}
    for sync in syncs:
        counts[sync] = counts.get(sync, 0) + 1
    return [f"{op} at {at}" + (f" (x{n})" if n > 1 else "") for (op, at), n in counts.items()]
