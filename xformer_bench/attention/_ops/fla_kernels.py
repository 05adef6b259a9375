"""When the recurrent mixers take flash-linear-attention's kernels (``fla``, an optional extra:
``pip install -e ".[fla]"``; Yang et al., https://github.com/fla-org/flash-linear-attention).

On CUDA tensors with ``fla`` importable, the chunked engines (:mod:`.gated_linear`,
:mod:`.delta_rule`) hand the same sums to fla's Triton kernels; everywhere else they run their
own PyTorch chunked form.  ``XBENCH_FLA=0`` keeps the PyTorch form on CUDA too, so the two paths
can be timed and compared on one GPU (``scripts/gpu_suite.sh``); no CPU path ever needs fla.

One declared exception: fla (0.6.0) refuses the backward pass of per-position scalar gates
(Mamba-2's and Gated DeltaNet's decays: its ``chunk_bwd_dqkwg``) on Hopper GPUs with Triton
>= 3.4.0 and < 3.7.1 unless tilelang is installed, because that Triton gives wrong results there
(fla issue #640; met on an H200 with Triton 3.6.0).  There, while gradients are on, those two
mixers run the PyTorch form, equal to fla's within bf16 tolerance, and say so once.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings

import torch


@functools.cache
def fla_available() -> bool:
    """Whether ``fla.ops`` imports (looked up once)."""
    try:
        import fla.ops  # noqa: F401
    except ImportError:
        return False
    return True


def gated_backward_refused(capability: tuple[int, int], triton_version: str,
                           has_tilelang: bool) -> bool:
    """fla's own condition for refusing a per-position gate's backward (issue #640)."""
    triton = tuple(int(part) for part in triton_version.split("+")[0].split(".")[:3])
    return capability[0] == 9 and (3, 4, 0) <= triton < (3, 7, 1) and not has_tilelang


@functools.cache
def _gated_backward_refused_here() -> bool:
    import triton

    return gated_backward_refused(torch.cuda.get_device_capability(), triton.__version__,
                                  importlib.util.find_spec("tilelang") is not None)


@functools.cache
def _say_once(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def use_fla(x: torch.Tensor, *, gated: bool = False) -> bool:
    """fla's kernels for ``x``: a CUDA tensor, fla installed, ``XBENCH_FLA`` not ``0``, and
    (for a per-position scalar gate, ``gated``) a backward pass fla does not refuse here."""
    if not (x.is_cuda and os.environ.get("XBENCH_FLA", "") != "0" and fla_available()):
        return False
    if gated and torch.is_grad_enabled() and _gated_backward_refused_here():
        _say_once("fla refuses the backward of per-position gates on Hopper with Triton "
                  "3.4.0-3.7.0 (fla issue #640): Mamba-2 and Gated DeltaNet train with "
                  "xbench's PyTorch chunked form; install triton>=3.7.1 or tilelang for fla's")
        return False
    return True
