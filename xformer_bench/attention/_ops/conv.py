"""The convolutions of Wu, Fan, Baevski, Dauphin & Auli (2019, "Pay Less Attention with
Lightweight and Dynamic Convolutions", ICLR), sections 3-4, shared by ``lightweight_conv``,
``dynamic_conv`` and the convolution branch of ``lsra`` (Lite Transformer).

Depth-wise convolution of width k over the C channels of X (T x C), as in section 3 (0-indexed
taps j, positions outside the sequence are zeros):

    DepthwiseConv(X, W, i, c) = sum_{j=0}^{k-1} W[c, j] X[i + j - left, c],

with ``left`` = k - 1 when causal (the kernel covers positions i-k+1 .. i: left padding only, as
the paper's decoder) and (k - 1) / 2 when bidirectional (centred; k must then be odd).

LightConv (section 3): the C channels are split into H heads of C/H *contiguous* channels
(channel c belongs to head floor(c H / C), the paper's ceil(cH/d) with 1-indexed c), one kernel
per head, softmax-normalised over its width,

    LightConv(X, W, i, c) = DepthwiseConv(X, softmax(W[h(c), :]), i, c),    W: H x k,

so a layer has H k kernel parameters, not C k.  DropConnect (``weight_dropout``) drops entries of
the normalised kernel in training (and rescales by 1/(1-p), ``F.dropout``).

DynamicConv (section 4): the kernel is predicted at every position from that position's input,

    DynamicConv(X, i, c) = LightConv(X, f(X_i)[h(c), :], i, c),   f(X_i) = W^Q X_i,  W^Q: Hk x C,

a linear map without bias (fairseq's ``weight_linear``).  Computed in blocks of L = max(k, 32)
positions, each a banded (L, L + k - 1) matrix of its positions' kernels times its L + k - 1
inputs (:func:`dynamic_kernel_conv`): O(T (L + k) C) time, O(T C + T H (L + k)) memory -- no
T x T tensor, and no (B, T, C, k) one (unfolded windows, D k elements per position).

:class:`ConvBranch` is the module of the paper's Figure 2: an input projection to 2C channels
followed by a GLU (Dauphin et al. 2017), padded positions zeroed, then the convolution.  The
output projection W^O belongs to the option that uses the branch (its layer named ``out``).
The query f reads is the conv input (the GLU output), as in fairseq's reference code.

Per-layer widths (the paper's models use 3, 7, 15, 31, 31, ... by layer): a builder does not
know its layer, so :class:`KernelWidths` holds every listed width and the module picks
``widths[min(ctx.layer, len - 1)]`` in the forward pass.  The kernel parameters are sized for the
widest one and a narrower layer uses a slice of them -- the taps nearest the current position
(causal) or the central ones (bidirectional); the taps it never uses are parameters that get zero
gradient and still count in the model's parameter total.  With one width (the default) nothing
is unused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.token_mlp import drop_padding
from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims

CONV_KINDS = ("lightweight", "dynamic")
BAND_BLOCK = 32
"""DynamicConv's smallest block of positions sharing a band (a narrower kernel still gets
matmuls of 32 rows): the band holds L + k - 1 entries per position and head, L - 1 of them
zeros, traded for matmul speed (forward + backward of the convolution at B = 2, T = 2048,
C = 128, H = 4, k = 31 on 2 CPU cores: 11-13 ms, against 133-140 ms for the unfolded
(B, T, C, k) windows contracted by einsum)."""


@dataclass(frozen=True)
class KernelWidths:
    """The kernel width of every layer: ``kernel_size`` everywhere, or ``kernel_sizes`` by
    layer (the last one for deeper layers); checked once, named as the YAML names them."""

    widths: tuple[int, ...]
    key: str  # "kernel_size" or "kernel_sizes": the option an error names
    option: str  # "lightweight_conv", "dynamic_conv", "lsra"

    @classmethod
    def of(cls, option: str, kernel_size: int, kernel_sizes: list[int] | None) -> KernelWidths:
        if kernel_sizes is None:
            if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 1:
                raise ConfigError(f"attention.kernel_size={kernel_size!r} must be a positive "
                                  f"integer (the width of attention={option}'s kernel)")
            return cls((kernel_size,), "kernel_size", option)
        widths = tuple(kernel_sizes)
        if not widths or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1
                                 for k in widths):
            raise ConfigError(f"attention.kernel_sizes={list(widths)} must be a non-empty list of "
                              f"positive integers (attention={option}'s width by layer), or null")
        return cls(widths, "kernel_sizes", option)

    @property
    def widest(self) -> int:
        return max(self.widths)

    @property
    def all_odd(self) -> bool:
        """Whether every layer can be centred: what bidirectional use needs."""
        return all(k % 2 for k in self.widths)

    def at(self, layer: int, *, causal: bool) -> int:
        width = self.widths[min(layer, len(self.widths) - 1)]
        if not causal and width % 2 == 0:
            value = self.widths[0] if self.key == "kernel_size" else list(self.widths)
            raise ConfigError(f"attention.{self.key}={value} must be odd for bidirectional use "
                              f"(a centred kernel; layer {layer} has width {width}): "
                              f"attention={self.option} with an even width is causal only")
        return width

    def taps(self, width: int, *, causal: bool) -> slice:
        """The taps of the widest kernel that a ``width``-wide layer uses."""
        start = self.widest - width if causal else (self.widest - width) // 2
        return slice(start, start + width)


def padding(width: int, *, causal: bool) -> tuple[int, int]:
    """Zeros (before, after) the sequence so output i reads i-k+1..i or i-(k-1)/2..i+(k-1)/2."""
    left = width - 1 if causal else (width - 1) // 2
    return left, width - 1 - left


def shared_kernel_conv(
    x: torch.Tensor,  # (B, T, C)
    kernel: torch.Tensor,  # (H, k): one (normalised) kernel per head of C/H contiguous channels
    *,
    causal: bool,
) -> torch.Tensor:  # (B, T, C)
    """DepthwiseConv with head h's kernel on channels h C/H .. (h+1) C/H - 1."""
    c = x.shape[-1]
    heads, width = kernel.shape
    weight = kernel.repeat_interleave(c // heads, dim=0)[:, None, :]  # (C, 1, k)
    padded = F.pad(x.transpose(1, 2), padding(width, causal=causal))  # (B, C, T + k - 1)
    return F.conv1d(padded, weight.to(x.dtype), groups=c).transpose(1, 2)  # (B, T, C)


def dynamic_kernel_conv(
    x: torch.Tensor,  # (B, T, C)
    kernels: torch.Tensor,  # (B, T, H, k): position t's kernel for each head
    *,
    causal: bool,
) -> torch.Tensor:  # (B, T, C)
    """DepthwiseConv with a kernel per position and head, as banded blocks (no T x T, no
    (B, T, C, k)): the outputs of L = max(k, BAND_BLOCK) consecutive positions read L + k - 1
    inputs; row i of the block's (L, L + k - 1) band holds position i's kernel at columns
    i .. i + k - 1 (the kernels padded to L + k columns and re-read with rows of L + k - 1,
    each row shifted one further), and one batched matmul applies the band to the inputs."""
    b, t, c = x.shape
    heads, width = kernels.shape[-2:]
    block = max(width, BAND_BLOCK)
    n = -(-t // block)  # blocks; the last padded with zero kernels
    before, after = padding(width, causal=causal)
    padded = F.pad(x, (0, 0, before, after + n * block - t))  # (B, nL + k - 1, C)
    padded = padded.view(b, -1, heads, c // heads).transpose(1, 2)  # (B, H, nL + k - 1, C/H)
    inputs = padded.unfold(2, block + width - 1, block).transpose(-1, -2)  # (B, H, n, L+k-1, C/H)
    skewed = F.pad(kernels.to(x.dtype), (0, block, 0, 0, 0, n * block - t))  # (B, nL, H, k + L)
    skewed = skewed.transpose(1, 2).reshape(b, heads, n, block * (width + block))[..., :-block]
    band = skewed.unflatten(-1, (block, block + width - 1))  # (B, H, n, L, L + k - 1)
    out = (band @ inputs).flatten(2, 3)[:, :, :t]  # (B, H, T, C/H)
    return out.transpose(1, 2).reshape(b, t, c)


class LightConv(nn.Module):
    """LightConv over C channels: H softmax-normalised kernels shared by C/H channels each."""

    def __init__(self, channels: int, heads: int, widths: KernelWidths,
                 weight_dropout: float = 0.0):
        super().__init__()
        self.heads, self.widths, self.weight_dropout = heads, widths, weight_dropout
        self.weight = nn.Parameter(torch.empty(heads, widths.widest))  # (H, k): kernel logits
        # fairseq's init: Xavier uniform on the (H, 1, k) kernel, fan_in k, fan_out H k.
        bound = math.sqrt(6 / (widths.widest * (heads + 1)))
        nn.init.uniform_(self.weight, -bound, bound)

    def kernel(self, *, causal: bool, layer: int = 0) -> torch.Tensor:  # (H, k_layer)
        """softmax(W) over the layer's taps, DropConnect in training."""
        width = self.widths.at(layer, causal=causal)
        kernel = self.weight[:, self.widths.taps(width, causal=causal)].float().softmax(-1)
        return F.dropout(kernel, self.weight_dropout, self.training)

    def forward(self, x: torch.Tensor, *, causal: bool, layer: int = 0) -> torch.Tensor:
        return shared_kernel_conv(x, self.kernel(causal=causal, layer=layer), causal=causal)


class DynamicConv(nn.Module):
    """DynamicConv over C channels: position t's H kernels are softmax(W^Q x_t) (H x k)."""

    def __init__(self, channels: int, heads: int, widths: KernelWidths,
                 weight_dropout: float = 0.0):
        super().__init__()
        self.heads, self.widths, self.weight_dropout = heads, widths, weight_dropout
        self.weight_linear = nn.Linear(channels, heads * widths.widest, bias=False)  # W^Q

    def kernels(self, x: torch.Tensor, *, causal: bool, layer: int = 0) -> torch.Tensor:
        """(B, T, C) -> (B, T, H, k_layer): softmax(W^Q x_t) per head, DropConnect in training."""
        width = self.widths.at(layer, causal=causal)
        logits = self.weight_linear(x).unflatten(-1, (self.heads, -1))  # (B, T, H, k_max)
        kernels = logits[..., self.widths.taps(width, causal=causal)].float().softmax(-1)
        return F.dropout(kernels, self.weight_dropout, self.training)  # (B, T, H, k)

    def forward(self, x: torch.Tensor, *, causal: bool, layer: int = 0) -> torch.Tensor:
        return dynamic_kernel_conv(x, self.kernels(x, causal=causal, layer=layer), causal=causal)


class ConvBranch(nn.Module):
    """The paper's Figure 2 without W^O: Linear(d_in -> 2C), GLU, padding zeroed, convolution."""

    def __init__(self, d_in: int, channels: int, heads: int, widths: KernelWidths, *,
                 kind: str = "lightweight", weight_dropout: float = 0.0):
        super().__init__()
        if kind not in CONV_KINDS:
            raise ConfigError(f"attention.conv={kind!r}; choose one of {', '.join(CONV_KINDS)}")
        if channels % heads:
            raise ConfigError(f"attention={widths.option}: its convolution's {channels} channels "
                              f"must be divisible by model.n_heads={heads} (one kernel per head)")
        if not 0.0 <= weight_dropout < 1.0:
            raise ConfigError(f"attention.weight_dropout={weight_dropout} must lie in [0, 1)")
        self.up = nn.Linear(d_in, 2 * channels)  # the input projection, halved by the GLU
        conv = LightConv if kind == "lightweight" else DynamicConv
        self.conv = conv(channels, heads, widths, weight_dropout)

    def forward(
        self,
        x: torch.Tensor,  # (B, T, d_in)
        *,
        causal: bool,
        layer: int = 0,
        key_padding_mask: torch.Tensor | None = None,  # (B, T) bool, True = padding
    ) -> torch.Tensor:  # (B, T, C)
        g = drop_padding(F.glu(self.up(x), dim=-1), key_padding_mask)  # (B, T, C)
        return self.conv(g, causal=causal, layer=layer)  # (B, T, C)


class ConvMixer(TokenMixer):
    """The whole sublayer of the paper's Figure 2b/2c: ConvBranch on d_model channels, then
    W^O (``out``, d -> d).  Subclasses name the convolution (``kind``) and register it."""

    kind = "lightweight"
    option = "lightweight_conv"
    sub_quadratic = True  # O(T k d): no pair of positions beyond the kernel's reach

    def __init__(self, dims: ModelDims, kernel_size: int = 31,
                 kernel_sizes: list[int] | None = None, weight_dropout: float = 0.0):
        super().__init__()
        widths = KernelWidths.of(self.option, kernel_size, kernel_sizes)
        self.provides = conv_capabilities(widths)
        self.branch = ConvBranch(dims.d_model, dims.d_model, dims.n_heads, widths, kind=self.kind,
                                 weight_dropout=weight_dropout)
        self.out = nn.Linear(dims.d_model, dims.d_model)  # W^O

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        y = self.branch(x, causal=ctx.causal, layer=ctx.layer,
                        key_padding_mask=ctx.key_padding_mask)  # (B, T, D)
        return self.out(y)  # (B, T, D)


def conv_capabilities(widths: KernelWidths) -> frozenset[str]:
    """Any length, both directions (bidirectional only with odd widths), padding zeroed; no
    queries, keys or token pairs, so no rotary and no additive position bias."""
    both = {"causal", "bidirectional"} if widths.all_odd else {"causal"}
    return frozenset(both | {"key_padding_mask", "variable_length"})
