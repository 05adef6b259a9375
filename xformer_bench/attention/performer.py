"""Performer attention, FAVOR+: Choromanski, Likhosherstov, Dohan, Song, Gane, Sarlos, Hawkins,
Davis, Mohiuddin, Kaiser, Belanger, Colwell & Weller 2021, "Rethinking Attention with
Performers" (ICLR).

Softmax attention's kernel exp(q . k / sqrt(d)) is estimated by random features,
phi(q)^T phi(k), and attention is computed as linear attention, D^-1 (phi(Q) (phi(K)^T V))
(section 2), causally through prefix sums (section 2, unidirectional) -- here the chunked prefix
sums of :func:`~xformer_bench.attention._ops.feature_maps.feature_attention`, shared with
``linear``.

* **Positive random features** (``kernel: softmax``, Lemma 1, h(x) = exp(-|x|^2 / 2)):
  phi(x) = exp(w_r . x - |x|^2 / 2) / sqrt(m), r = 1..m, on x = q / d^(1/4) (so that
  E[phi(q)^T phi(k)] = exp(q . k / sqrt(d))).  The authors' numerical stabiliser
  (``softmax_kernel_transformation``): subtract the largest exponent before exp and add 1e-6.
  For a query the largest over its own features, as there; for a key also its own, kept as
  a log-scale that the prefix sums restore exactly relative to a running maximum (the
  authors' code subtracts one maximum over every key of the batch, which is not causal).
* **Performer-ReLU** (``kernel: relu``, the paper's "generalized attention", f = ReLU):
  phi(x) = relu(w_r . x) / sqrt(m) + 1e-3, on unscaled x (the authors'
  ``relu_kernel_transformation``).
* **Orthogonal random features** (section 2.4): w drawn in blocks of d exactly orthogonal
  rows (QR of a Gaussian matrix), each row rescaled to the norm of an independent
  d-dimensional Gaussian vector, so every row is marginally N(0, I_d) (the authors'
  ``GaussianOrthogonalRandomMatrix``, scaling=0).  One (m, Dh) matrix per layer, shared by
  its heads, as there.
* **Redrawing** (the paper redraws the features periodically in training): the features are
  redrawn every ``redraw_interval`` optimiser steps, before the first training step that uses
  them (``before_training_step``, called by
  :func:`~xformer_bench.core.step_updates.prepare_training_step`; steps counted in the buffer
  ``steps`` by ``apply_pending_updates`` after each step), as performer-pytorch redraws at the
  start of a training forward; never in evaluation. So an evaluation after step N uses the
  features step N trained with: redrawn right after step N = k x interval, a validation there
  (and a final one when max_steps is a multiple of the interval) would score a draw no step had
  used (systems_lm's Performer at 2,000 steps: 1.1-1.8 bpb worse at steps 1,000 and 2,000,
  recovered by step 1,250). The forward itself reads no host counter: activation checkpointing's
  replay and the reversible stack's recompute see the same features, and ``torch.compile``
  compiles it once (a Python step counter read in the forward recompiled it every step). Draw n
  is a function of (``seed``, n) only -- a CPU ``torch.Generator`` seeded with both -- and
  ``seed`` is drawn from torch's generator when the layer is built (reproducible from
  ``torch.manual_seed``, distinct per layer) and stored as a buffer with the features and the
  step count, so a restored checkpoint evaluates with exactly its features and trains on with
  the draw its step count is due.

``n_features`` m = 256, the paper's experimental setting; its uniform-convergence result
(section 3) asks m = Theta(d log d), 266 at Dh = 64.  ``redraw_interval`` 1000 is not stated
in the paper: it is performer-pytorch's default (Wang's port of the authors' code).  Padded
keys get zero features; additive position biases cannot enter a kernel sum: not supported.
"""

from __future__ import annotations

import math

import torch
from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.feature_maps import feature_attention, full_precision
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION

SOFTMAX_STABILISER = 1e-6  # added to every positive feature (the authors' code)
RELU_STABILISER = 1e-3  # added to every ReLU feature (the authors' code)
NORMALISER_EPS = 1e-12
"""Added to the normaliser only so that a query with no unpadded key gives 0: the stabilisers
keep every other normaliser positive (the authors' code adds nothing)."""


def orthogonal_gaussian(m: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """(m, d): blocks of d orthogonal rows, each rescaled to a chi_d-distributed norm."""
    blocks = []
    for _ in range(math.ceil(m / d)):
        gaussian = torch.randn(d, d, generator=generator, dtype=torch.float64)
        blocks.append(torch.linalg.qr(gaussian).Q.T)  # (d, d), orthonormal rows
    rows = torch.cat(blocks)[:m]  # (m, d)
    norms = torch.randn(m, d, generator=generator, dtype=torch.float64).norm(dim=1)  # (m,)
    return (rows * norms[:, None]).float()


def softmax_features(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive random features of ``x`` (B, H, L, Dh) under ``w`` (m, Dh), stabilised:
    (features (B, H, L, m), each row's log-scale (B, H, L)); the true features are
    features * exp(log-scale)."""
    x = x.float() * x.shape[-1] ** -0.25
    exponent = (x @ w.T).sub_(x.square().sum(-1, keepdim=True) / 2)  # (B, H, L, m)
    top = exponent.detach().amax(-1, keepdim=True)  # (B, H, L, 1)
    root_m = math.sqrt(w.shape[0])
    # (exp(exponent - top) + stabiliser) / sqrt(m), the 1 / sqrt(m) inside the exp: one pass less
    features = (exponent - (top + math.log(root_m))).exp() + SOFTMAX_STABILISER / root_m
    return features, top.squeeze(-1)  # (B, H, L, m), (B, H, L)


def relu_features(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Performer-ReLU features of ``x`` (B, H, L, Dh): (B, H, L, m)."""
    return torch.relu(x.float() @ w.T) / math.sqrt(w.shape[0]) + RELU_STABILISER


@ATTENTION.register("performer")
class PerformerAttention(AttentionKernel):
    provides = frozenset({"causal", "bidirectional", "longer_keys", "key_padding_mask",
                          "variable_length"})
    sub_quadratic = True

    def __init__(self, dims: ModelDims, n_features: int = 256, redraw_interval: int = 1000,
                 kernel: str = "softmax", chunk_size: int = 64):
        super().__init__()
        if kernel not in ("softmax", "relu"):
            raise ValueError(f"kernel={kernel!r}: choose softmax or relu")
        if n_features < 1 or redraw_interval < 1 or chunk_size < 1:
            raise ValueError("n_features, redraw_interval and chunk_size must be positive")
        self.n_features, self.redraw_interval = n_features, redraw_interval
        self.kernel, self.chunk_size, self.head_dim = kernel, chunk_size, dims.head_dim
        seed = torch.randint(0, 2 ** 31, (), dtype=torch.int64)  # from torch's seeded generator
        self.register_buffer("seed", seed)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))  # training calls
        self._seed, self._steps = int(seed), 0  # host copies: no device sync per forward
        self._drawn: int | None = 0  # the draw in ``features``; None: as restored, re-derived
        self.register_buffer("features", self.draw(0))  # (m, Dh)
        self.register_load_state_dict_post_hook(PerformerAttention._read_counters)

    @staticmethod
    def _read_counters(module: PerformerAttention, incompatible_keys) -> None:
        module._seed, module._steps, module._drawn = int(module.seed), int(module.steps), None

    def draw(self, n: int) -> torch.Tensor:
        """The features of redraw ``n``: a function of (seed, n) only."""
        generator = torch.Generator().manual_seed(self._seed * 1_000_003 + n)
        return orthogonal_gaussian(self.n_features, self.head_dim, generator)

    def apply_pending_updates(self) -> None:
        """Count a training step (called after the optimiser step,
        :mod:`xformer_bench.core.step_updates`)."""
        if self.training:
            self._steps += 1
            self.steps.fill_(self._steps)

    def before_training_step(self) -> None:
        """Redraw when ``redraw_interval`` more steps have been counted since the draw in use
        (called before each training batch)."""
        due = self._steps // self.redraw_interval
        if due != self._drawn:  # a restored layer draws its due features again: the same
            self.features.copy_(self.draw(due))
            self._drawn = due

    def extra_repr(self) -> str:
        return (f"kernel={self.kernel}, n_features={self.n_features}, "
                f"redraw_interval={self.redraw_interval}")

    def forward(
        self,
        q: torch.Tensor,  # (B, H, T, Dh)
        k: torch.Tensor,  # (B, H, S, Dh)
        v: torch.Tensor,  # (B, H, S, Dh)
        *,
        causal: bool,
        bias: PairBias | None = None,
        key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
        layer: int = 0,
    ) -> torch.Tensor:  # (B, H, T, Dh)
        if bias is not None:
            raise ValueError("performer attention cannot add a pair bias")
        w, scale = self.features.float(), None  # (m, Dh)
        with full_precision(q):  # exp of a bf16 exponent would be far off
            if self.kernel == "softmax":
                phi_q, _ = softmax_features(q, w)  # (B, H, T, m): a query's scale cancels
                phi_k, scale = softmax_features(k, w)  # (B, H, S, m), (B, H, S)
            else:
                phi_q, phi_k = relu_features(q, w), relu_features(k, w)  # (B, H, T|S, m)
        return feature_attention(phi_q, phi_k, v, causal=causal, chunk=self.chunk_size,
                                 eps=NORMALISER_EPS, key_log_scale=scale,
                                 key_padding_mask=key_padding_mask)  # (B, H, T, Dh)
