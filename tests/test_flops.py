"""FLOPs of a training step: the counter's matmuls, analytic formulas where it is blind (FFT),
and the costly ops nothing counted named in the result instead of a silent 0."""

from __future__ import annotations

import math

import torch
from torch import nn

from xformer_bench.models.flops import _transform_flops, training_step_flops


class Fourier(nn.Module):
    """FNet's mixing (Lee-Thorp et al. 2021): the real part of a 2-D FFT over sequence and
    hidden, between an embedding and a linear read-out."""

    def __init__(self, vocab: int = 16, d: int = 8, orthogonalise: bool = False):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        self.readout = nn.Linear(d, vocab)
        self.orthogonalise = orthogonalise

    def forward(self, tokens):  # (B, T) -> (B, T, V)
        x = self.embedding(tokens)  # (B, T, D)
        x = torch.fft.fft2(x, dim=(-2, -1)).real
        if self.orthogonalise:
            x = x @ torch.linalg.qr(self.readout.weight[:, :8].T @ self.readout.weight[:, :8])[0]
        return self.readout(x)


def test_a_fourier_transform_is_counted_by_its_formula():
    t, d, vocab = 32, 8, 16
    count = training_step_flops(Fourier(vocab, d), seq_len=t, batch_size=3)
    fft = 5 * t * d * math.log2(t * d)  # one complex 2-D transform of T x D points
    assert count.analytic == {"aten._fft_c2c": int(3 * 2 * fft)}  # forward + its backward, x3
    readout = 2 * t * d * vocab * 3  # forward, input gradient, weight gradient: 2 FLOPs a MAC
    assert count.total == int(3 * 2 * fft) + 3 * readout
    assert count.uncounted == []


def test_a_costly_op_nothing_counts_is_named_not_passed_off_as_zero():
    count = training_step_flops(Fourier(orthogonalise=True), seq_len=8, batch_size=1)
    assert "aten.linalg_qr" in count.uncounted


def test_transform_formula_and_scaling():
    assert _transform_flops((4, 8), [1], 5.0) == int(5 * 32 * 3)  # 4 transforms of 8 points
    assert _transform_flops((4, 1), [1], 5.0) == 0
    count = training_step_flops(Fourier(), seq_len=8, batch_size=1)
    doubled = count.scaled(2)
    assert doubled.total == 2 * count.total
    assert doubled.analytic == {op: 2 * n for op, n in count.analytic.items()}
