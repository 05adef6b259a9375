"""FLOPs of one training step: counted by ``torch.utils.flop_counter``, with analytic formulas
where the counter is blind, and a list of what nothing counted.

The counter sees matrix products, convolutions and attention kernels.  It counts 0 for a
Fourier transform (FNet) and for the ``linalg`` family; the transforms get the standard
radix-2 estimate here (:data:`ANALYTIC`), and any other op of those families that runs is
named in :attr:`FlopCount.uncounted`, so a record never passes a blind 0 off as a count.
Elementwise work (activations, norms, softmax) is not counted, by the usual convention.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

aten = torch.ops.aten


def _transform_flops(shape: tuple[int, ...], dims: list[int], per_point: float) -> int:
    """``per_point * N * log2(n_1 ... n_k)``: a k-dimensional FFT of a tensor of N points is
    N / n_d one-dimensional transforms of ``per_point * n_d log2 n_d`` along each dim d."""
    lengths = math.prod(shape[d] for d in dims)
    return int(per_point * math.prod(shape) * math.log2(lengths)) if lengths > 1 else 0


def _fft_c2c(x_shape, dim, *args, out_shape=None, **kwargs) -> int:
    return _transform_flops(x_shape, dim, 5.0)  # complex radix-2: 5 N log2 N


def _fft_r2c(x_shape, dim, *args, out_shape=None, **kwargs) -> int:
    return _transform_flops(x_shape, dim, 2.5)  # a real input: half the complex work


def _fft_c2r(x_shape, dim, *args, out_shape=None, **kwargs) -> int:
    return _transform_flops(out_shape, dim, 2.5)  # N: the real output's points


ANALYTIC = {aten._fft_c2c: _fft_c2c, aten._fft_r2c: _fft_r2c, aten._fft_c2r: _fft_c2r}
"""Formulas for ops the counter does not know (Cooley & Tukey 1965; the usual 5 N log2 N)."""

COSTLY_FAMILIES = ("_fft", "fft_", "linalg", "_linalg", "cholesky", "triangular_solve", "svd",
                   "qr", "eig", "lu", "conv")
"""Name prefixes of ops that cost more than elementwise work: one of them with neither the
counter's formula nor an analytic one is reported as uncounted."""


@dataclass
class FlopCount:
    total: int
    analytic: dict[str, int] = field(default_factory=dict)  # op -> FLOPs from ANALYTIC
    uncounted: list[str] = field(default_factory=list)  # costly ops nothing counted

    def scaled(self, factor: int) -> FlopCount:
        return FlopCount(self.total * factor, {op: n * factor for op, n in self.analytic.items()},
                         list(self.uncounted))


class _OpsSeen(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.packets: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.packets[func.overloadpacket] += 1
        return func(*args, **(kwargs or {}))


def _uncounted(packets, known) -> list[str]:
    names = {str(p) for p in packets if p not in known}
    return sorted(n for n in names if n.removeprefix("aten.").startswith(COSTLY_FAMILIES))


def training_step_flops(model: nn.Module, seq_len: int, batch_size: int,
                        sample: torch.Tensor | tuple[torch.Tensor, ...] | None = None
                        ) -> FlopCount:
    """Forward + backward FLOPs of ``model`` on a batch of ``batch_size`` sequences of ``seq_len``
    (``sample``: one example of the model's inputs, (1, ...) each: a tensor or a tuple of
    arguments; default zero tokens (1, seq_len)).

    Counted on one sequence and scaled by the batch size (the count is linear in it).
    Attention runs in the math backend here so that its matmuls are visible to the counter;
    fused kernels skip the masked half under causality, so this is the dense-attention count.
    The model runs in eval mode, so nothing stateful moves (dropout draws no numbers, running
    statistics stay, experts drop no token: the full-capacity count); gradients are cleared
    afterwards.  The optimizer update is not included.
    """
    was_training = model.training
    device = next(model.parameters()).device
    sample = torch.zeros(1, seq_len, dtype=torch.long) if sample is None else sample
    arguments = tuple(a.to(device) for a in (sample if isinstance(sample, tuple) else (sample,)))
    model.eval()
    counter, seen = FlopCounterMode(display=False, custom_mapping=ANALYTIC), _OpsSeen()
    try:
        with sdpa_kernel(SDPBackend.MATH), counter, seen:
            model(*arguments).float().mean().backward()
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    by_op = counter.get_flop_counts()["Global"]
    analytic = {str(op): int(n) for op, n in by_op.items() if op in ANALYTIC and n}
    count = FlopCount(int(counter.get_total_flops()), analytic,
                      _uncounted(seen.packets, {*flop_registry, *ANALYTIC}))
    return count.scaled(batch_size)
