"""Synthesizer: Tay, Bahri, Metzler, Juan, Zhao & Zheng 2021, "Synthesizer: Rethinking
Self-Attention in Transformer Models" (ICML 2021): attention weights synthesised
without token-token dot products.  A token mixer with projections of its own: the values
G(X) (``v``), the synthetic logits B of width l = ``dims.seq_len`` per head, the output
layer ``out``:

    Y_h = softmax(B_h) G_h(X)                                              (B_h: T x l)

* ``dense`` (the Dense Synthesizer): B_i = F(X_i) = W_2 relu(W_1 X_i + b_1) + b_2, each token
  alone.  W_1 (d x d) gives every head its own d/H-wide hidden slice; W_2 (d/H x l) is shared by the
  heads, as in both of the authors' implementations (Mesh TensorFlow ``dense_minus``, whose
  W_1 is the query projection, and the Long Range Arena ``SynthesizerAttention``).
* ``random`` (the Random Synthesizer): B = R, a learned l x l matrix per head, the same for
  every input (``trainable: false`` is the paper's Fixed Random).  Not sub-quadratic: that
  is its design.
* ``factorized_dense``: A = F_A(X_i) in R^a, B' = F_B(X_i) in R^b, a b = l (a = ``factor``, by
  default the largest divisor of l up to sqrt(l)), B_i = H_A(A) * H_B(B') -- read here as
  each entry of A repeated b times times B' tiled a times, i.e. the outer product A B'^T
  flattened, so that every (u, v) pair occurs once.  F_A, F_B share the hidden layer W_1.
* ``factorized_random``: R = R_1 R_2^T with R_1, R_2 in R^{l x k}, k = ``rank`` (the paper's
  k = 8).

Random matrices start at LeCun normal as in the authors' LRA code (R ~ N(0, 1/l); R_1 ~ N(0,
1/l), R_2 ~ N(0, 1/k), so R_1 R_2^T has the same variance).  ``mix_with_dot_product`` is the
paper's mixture of synthesizers ("Random + Vanilla", "Dense + Vanilla" in its tables),
softmax(alpha B + (1 - alpha) q k^T / sqrt(Dh)) with a learned alpha = sigmoid(a), a = 0 at
start, one per layer -- the authors' Mesh TensorFlow ``*_plus_alpha`` modes (the LRA code
instead sums the logits: alpha = 1/2, up to a factor 2).  The mixture has queries and keys (rotary
positions rotate them) and takes the position scheme's additive bias on its logits; without
it there are neither.

Causality: the synthetic logits of a key after the query are masked, as any logit.  The
layer is built for sequences of at most l = ``dims.seq_len`` tokens (B has l columns); a
shorter input uses the first T rows and columns, a longer one is an error.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.logits import allowed_pairs, masked_softmax
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION

MODES = ("dense", "random", "factorized_dense", "factorized_random")


def default_factor(length: int) -> int:
    """The largest divisor of ``length`` up to its square root."""
    return max(a for a in range(1, math.isqrt(length) + 1) if length % a == 0)


@ATTENTION.register("synthesizer")
class Synthesizer(TokenMixer):
    def __init__(self, dims: ModelDims, mode: str = "dense", mix_with_dot_product: bool = False,
                 rank: int = 8, factor: int | None = None, trainable: bool = True):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"attention.mode={mode!r}: choose one of {', '.join(MODES)}")
        d, h, length = dims.d_model, dims.n_heads, dims.seq_len
        self.mode, self.length, self.n_heads, self.head_dim = mode, length, h, dims.head_dim
        self.v = nn.Linear(d, d)  # G(X)
        self.out = nn.Linear(d, d)
        if mode in ("dense", "factorized_dense"):
            self.hidden = nn.Linear(d, d)  # W_1, b_1: a d/H-wide slice per head
        if mode == "dense":
            self.logits = nn.Linear(dims.head_dim, length)  # W_2, b_2, shared by the heads
        elif mode == "factorized_dense":
            a = factor or default_factor(length)
            if length % a:
                raise ValueError(f"attention.factor={a} must divide data.seq_len={length}")
            self.factor_a = nn.Linear(dims.head_dim, a)
            self.factor_b = nn.Linear(dims.head_dim, length // a)
        elif mode == "random":
            self.random = nn.Parameter(torch.randn(h, length, length) * length ** -0.5,
                                       requires_grad=trainable)  # (H, l, l)
        else:
            self.random_1 = nn.Parameter(torch.randn(h, length, rank) * length ** -0.5,
                                         requires_grad=trainable)  # (H, l, k)
            self.random_2 = nn.Parameter(torch.randn(h, length, rank) * rank ** -0.5,
                                         requires_grad=trainable)  # (H, l, k)
        self.mix = mix_with_dot_product
        tags = {"causal", "bidirectional", "key_padding_mask"}
        if self.mix:
            self.qk = nn.Linear(d, 2 * d)
            self.mix_logit = nn.Parameter(torch.zeros(()))  # alpha = sigmoid(0) = 1/2
            tags |= {"queries_and_keys", "additive_bias"}
        self.provides = frozenset(tags)

    def heads(self, y: torch.Tensor) -> torch.Tensor:  # (B, T, H*w) -> (B, H, T, w)
        return y.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)

    def synthetic_logits(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B|1, H, T, T)
        t = x.shape[1]
        if self.mode == "random":
            return self.random[None, :, :t, :t]  # (1, H, T, T)
        if self.mode == "factorized_random":
            r1, r2 = self.random_1[:, :t], self.random_2[:, :t]  # (H, T, k) each
            return (r1 @ r2.transpose(-1, -2))[None]  # (1, H, T, T)
        hidden = self.heads(F.relu(self.hidden(x)))  # (B, H, T, Dh)
        if self.mode == "dense":
            return self.logits(hidden)[..., :t]  # (B, H, T, T)
        a, b = self.factor_a(hidden), self.factor_b(hidden)  # (B, H, T, a), (B, H, T, b)
        return (a[..., :, None] * b[..., None, :]).flatten(-2)[..., :t]  # (B, H, T, T)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        b, t, d = x.shape
        if t > self.length:
            raise ValueError(f"attention=synthesizer was built for data.seq_len={self.length} "
                             f"positions and got {t}")
        logits = self.synthetic_logits(x)  # (B|1, H, T, T)
        if self.mix:
            q, k = (self.heads(y) for y in self.qk(x).chunk(2, dim=-1))  # (B, H, T, Dh) each
            q, k = ctx.position.rotate(q, k)
            alpha = torch.sigmoid(self.mix_logit)
            dot = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, H, T, T)
            logits = alpha * logits + (1 - alpha) * dot
            bias = ctx.position.bias(t, t, layer=ctx.layer, query=q)
            if bias is not None:
                logits = logits + bias.dense()
        valid = allowed_pairs(t, t, causal=ctx.causal, key_padding_mask=ctx.key_padding_mask,
                              device=x.device)  # (T, T) | (B, 1, T, T)
        weights = masked_softmax(logits, valid)  # (B, H, T, T)
        y = weights.to(x.dtype) @ self.heads(self.v(x))  # (B, H, T, Dh)
        return self.out(y.transpose(1, 2).reshape(b, t, d))
