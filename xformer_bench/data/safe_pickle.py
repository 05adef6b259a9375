"""Reading pickles from files we did not write (the CIFAR-10 python batches) without letting
them run code.

A pickle names the callables it wants to rebuild its objects with, and an ordinary
``pickle.load`` imports and calls whatever it names (``os.system`` included).  The
:class:`RestrictedUnpickler` here resolves only the few names a pickled dict of numpy arrays,
lists, ints and bytes needs -- numpy's array reconstructor, ``numpy.ndarray``,
``numpy.dtype`` and a latin-1-only stand-in for ``_codecs.encode`` (how protocol-2 pickles
written by Python 3 store bytes) -- and refuses every other name with one
:class:`pickle.UnpicklingError` line, before anything is called.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np

try:  # numpy >= 2 keeps the reconstructor in numpy._core; numpy 1 in numpy.core
    from numpy._core.multiarray import _reconstruct
except ImportError:  # pragma: no cover -- numpy 1
    from numpy.core.multiarray import _reconstruct


def _latin1_bytes(text: str, encoding: str) -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for bytes, and nothing else."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"refusing _codecs.encode(..., {encoding!r}) in an "
                                     "untrusted pickle")
    return text.encode("latin1")


ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,  # numpy 1 (and Python 2) pickles
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,  # numpy 2 pickles
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_bytes,
}
"""Every global an untrusted pickle may name, and what it gets instead of an import."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ALLOWED` names (numpy arrays, builtin
    containers, bytes); any other global is refused with one line naming it."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name} from an untrusted pickle "
                "(only numpy arrays, lists, dicts, ints and bytes are allowed)") from None


def loads(data: bytes, encoding: str = "bytes") -> Any:
    """Unpickle ``data`` with :class:`RestrictedUnpickler`; ``encoding="bytes"`` reads
    Python 2 strings (the CIFAR batches' keys and array buffers) as bytes."""
    return RestrictedUnpickler(io.BytesIO(data), encoding=encoding).load()
