"""Hyena: Poli, Massaroli, Nguyen, Fu, Dao, Baccus, Bengio, Ermon & Ré 2023, "Hyena Hierarchy:
Towards Larger Convolutional Language Models" (ICML), the order-2 operator as in the authors'
released code (HazyResearch/safari, ``src/models/sequence/hyena.py``).

Three projections of the input, each through a short causal depthwise convolution (width
``short_filter``), then one implicit long convolution between two data-controlled gates
(section 3, eq. 4 with N = 2):

    (x0, x1, v) = ShortConv(x W_in + b_in),
    z = x1 * v,
    y = x0 * (h * z + beta * z),          (h * z)_t = sum_{s <= t} h[t - s] z_s,
    out = y W_out,

per channel, beta a learnt per-channel skip (their filter bias).  The filter is implicit
(section 3.3): for position l,

    h[l] = FFN(PE(l)) * exp(-|delta_c| t_l),
    PE(l) = (t_l, Re e^{-i f_k w_l}, Im e^{-i f_k w_l}),  t_l = l / (L - 1),  w_l = 2 pi l / L,

with (emb_dim - 1) / 2 frequencies f_k from 1e-4 to bands - 1, the FFN Linear(emb_dim, W), sin,
two Linear(W, W), sin each, Linear(W, D) without bias (W = ``filter_order``), every sin(omega x)
sharing one learnt omega per unit started at ``sine_freq``, and the window's decays delta_c
spaced linearly from log(target) / slow_decay_pct to log(target) / fast_decay_pct over the
channels (fixed, as theirs).  L = ``position_scale`` is, when null, the training length
``data.seq_len`` (``dims.seq_len``; their l_max), so t spans [0, 1] over a training sequence
at every length.

Initialisation and optimisation of the filter as safari's LM: every ``nn.Linear`` of the FFN
N(0, 0.02) with zero biases (``_init_weights`` of ``src/models/sequence/long_conv_lm.py``,
applied to the whole model), and the FFN's parameters (its matrices, biases and omega) without
weight decay (``HyenaFilter``'s ``_optim = {"weight_decay": wd = 0, "lr": lr}``; marked
``_no_weight_decay``, :mod:`xformer_bench.tasks.optimization`).  Their ``lr`` is the
optimiser's own in ``configs/experiment/pile/hyena.yaml``, as here (HyenaFilter's default,
1e-3, is not used there).

Computation: the long convolution by FFT (:mod:`~xformer_bench.attention._ops.long_conv`, its
exactly-causal tiled form; on a GPU the same code on cuFFT -- fla has no Hyena kernel).
Decoding keeps its inputs (``decode_state = "history"``): ``slot["history"]`` holds z of every
position so far (B, D, S), ``slot["tail"]`` the last short_filter - 1 projections and
``slot["taps"]`` the filter's taps h[0 .. S - 1] (D, S), extended by the new lags only; the next
output is sum_s h[t - s] z_s over the kept history (O(S D) per token), a multi-token step the
convolution over the history.  Causal only, as the paper.

Deviations.  Their PE is a table of l_max rows, learnt at lr_pos_emb, and a longer input is cut
to l_max; here PE is computed from l, not learnt, so the filter is defined past L too (t > 1,
the window decaying further) for evaluation and decoding beyond the training length.  An
integer ``position_scale`` fixes L whatever the training length.  The projections take the
model-wide initialisation (theirs is the same N(0, 0.02) of every Linear, with the output
projection at 0.02 / sqrt(2 n_layer): GPT-2's scheme, which this project replaces for every
mixer, :mod:`xformer_bench.core.init`).  A key padding mask zeroes the padded projections and
z, so padded positions reach no other.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.feature_maps import full_precision
from xformer_bench.attention._ops.long_conv import causal_conv
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.core.init import mark_initialised
from xformer_bench.errors import ConfigError
from xformer_bench.registry import ATTENTION

FILTER_INIT_STD = 0.02
"""Std of the filter FFN's weights: safari's ``initializer_range`` (GPT-2's)."""


class ImplicitFilter(nn.Module):
    """h (C, T): the FFN over positional features, times the exponential-decay window."""

    def __init__(self, channels: int, emb_dim: int, width: int, sine_freq: float,
                 position_scale: int, decays: tuple[float, float, float]):
        super().__init__()
        self.bands, self.scale = (emb_dim - 1) // 2, position_scale
        self.layers = nn.ModuleList([nn.Linear(emb_dim, width), nn.Linear(width, width),
                                     nn.Linear(width, width),
                                     nn.Linear(width, channels, bias=False)])
        for layer in self.layers:  # safari's _init_weights: N(0, 0.02), biases zero
            nn.init.normal_(layer.weight, std=FILTER_INIT_STD)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        self.freq = nn.Parameter(torch.full((width,), float(sine_freq)))  # one Sin module, shared
        mark_initialised(*self.parameters())
        for p in self.parameters():  # HyenaFilter's _optim: weight decay 0
            p._no_weight_decay = True
        fast, slow, target = decays
        self.register_buffer("deltas", torch.linspace(math.log(target) / slow,
                                                      math.log(target) / fast, channels).abs(),
                             persistent=False)  # (C,)

    def forward(self, length: int, start: int = 0) -> torch.Tensor:  # (C, length), float32
        """The taps of positions start .. start + length - 1."""
        with full_precision(self.freq):  # sin(14 x) would amplify bf16's rounding of x
            return self._taps(torch.arange(start, start + length, device=self.freq.device,
                                           dtype=torch.float32))

    def times(self, pos: torch.Tensor) -> torch.Tensor:
        """t_l = l / (L - 1): 0 .. 1 over the first L = ``scale`` positions, > 1 past them."""
        return pos / (self.scale - 1)

    def _taps(self, pos: torch.Tensor) -> torch.Tensor:
        t = self.times(pos)  # (T,)
        f = torch.linspace(1e-4, self.bands - 1, self.bands, device=pos.device)  # (bands,)
        angle = (2 * math.pi / self.scale) * pos[:, None] * f  # (T, bands)
        h = torch.cat([t[:, None], angle.cos(), -angle.sin()], dim=-1)  # (T, emb_dim)
        for layer in self.layers[:-1]:
            h = torch.sin(self.freq * layer(h))  # (T, W)
        h = self.layers[-1](h) * torch.exp(-t[:, None] * self.deltas)  # (T, C)
        return h.transpose(0, 1)


@ATTENTION.register("hyena")
class Hyena(TokenMixer):
    provides = frozenset({"causal", "key_padding_mask", "variable_length"})
    sub_quadratic = True  # FFT convolution, O(T log^2 T); no T x T
    decode_state = "history"

    def __init__(self, dims: ModelDims, filter_order: int = 64, emb_dim: int = 33,
                 sine_freq: float = 14.0, short_filter: int = 3,
                 position_scale: int | None = None,
                 fast_decay_pct: float = 0.3, slow_decay_pct: float = 1.5,
                 decay_target: float = 0.01, dropout: float = 0.0, chunk_size: int = 64):
        super().__init__()
        if emb_dim < 3 or emb_dim % 2 == 0:
            raise ConfigError(f"attention.emb_dim={emb_dim} must be odd and >= 3 (t, then a "
                              "cosine and a sine per frequency)")
        if position_scale is None:  # the training length (their l_max); t needs L >= 2
            position_scale = max(2, dims.seq_len)
        for key, value, low in (("filter_order", filter_order, 1),
                                ("short_filter", short_filter, 1),
                                ("position_scale", position_scale, 2),
                                ("chunk_size", chunk_size, 1)):
            if value < low:
                raise ConfigError(f"attention.{key}={value} must be at least {low}")
        if not (fast_decay_pct > 0 and slow_decay_pct > 0 and 0 < decay_target < 1):
            raise ConfigError(f"attention.fast_decay_pct={fast_decay_pct}, slow_decay_pct="
                              f"{slow_decay_pct} must be positive and decay_target={decay_target} "
                              "in (0, 1)")
        if not 0 <= dropout < 1:
            raise ConfigError(f"attention.dropout={dropout} must lie in [0, 1)")
        d = dims.d_model
        self.width, self.reach, self.chunk_size = d, short_filter, chunk_size
        self.in_proj = nn.Linear(d, 3 * d)  # x0, x1, v
        self.short = nn.Conv1d(3 * d, 3 * d, short_filter, groups=3 * d)  # PyTorch's init
        self.filter = ImplicitFilter(d, emb_dim, filter_order, sine_freq, position_scale,
                                     (fast_decay_pct, slow_decay_pct, decay_target))
        self.beta = nn.Parameter(torch.randn(d))  # (D,): their filter bias, the skip term
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        if not ctx.causal:
            raise ValueError("attention=hyena is causal only (the paper defines no "
                             "bidirectional form)")
        pad = None if ctx.key_padding_mask is None else ctx.key_padding_mask[:, None, :]
        u = self.in_proj(x).transpose(1, 2)  # (B, 3D, T)
        u = u if pad is None else u.masked_fill(pad, 0.0)
        if ctx.cache is not None:
            y = self._decode(u, ctx)
        else:
            x0, x1, v = self.short(F.pad(u, (self.reach - 1, 0))).split(self.width, dim=1)
            z = self.drop(x1 * v)  # (B, D, T)
            z = z if pad is None else z.masked_fill(pad, 0.0)
            h = self.filter(z.shape[-1])  # (D, T)
            y = x0 * (causal_conv(z, h, chunk=self.chunk_size) + z * self.beta[:, None])
        return self.out(y.transpose(1, 2))  # (B, T, D)

    def _decode(self, u: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """The new tokens' projections u (B, 3D, n) after the kept ones: y (B, D, n)."""
        slot = ctx.cache.slot()
        before = slot.get("tail")
        if before is None:  # the forward's zero padding
            before = u.new_zeros(*u.shape[:2], self.reach - 1)
        window = torch.cat([before, u], dim=-1)  # (B, 3D, reach - 1 + n)
        slot["tail"] = window[..., window.shape[-1] - (self.reach - 1):]
        x0, x1, v = self.short(window).split(self.width, dim=1)  # (B, D, n) each
        z, n = x1 * v, u.shape[-1]
        history = z if "history" not in slot else torch.cat([slot["history"], z], dim=-1)
        new_taps = self.filter(n, start=history.shape[-1] - n)  # (D, n): the new lags' taps
        h = new_taps if "taps" not in slot else torch.cat([slot["taps"], new_taps], dim=-1)
        slot["history"], slot["taps"] = history, h  # (B, D, S), (D, S)
        if n == 1:  # the next output from the kept history and the taps: O(S D)
            long = (history.float() * h.flip(-1)).sum(-1, keepdim=True).to(z.dtype)
        else:
            long = causal_conv(history, h, chunk=self.chunk_size)[..., -n:]
        return x0 * (long + z * self.beta[:, None])
