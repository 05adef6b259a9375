"""FNet's Fourier sublayer (Lee-Thorp, Ainslie, Eckstein & Ontanon 2022, "FNet: Mixing Tokens
with Fourier Transforms", NAACL), section 3.2: the self-attention sublayer replaced by a 2-D
discrete Fourier transform, one 1-D DFT along the hidden dimension and one along the sequence,
keeping the real part:

    y = Re(F_seq(F_hidden(x))),      F_n[j, k] = exp(-2 pi i j k / n),

i.e. ``torch.fft.fft2`` over the last two axes of (B, T, D).  No parameters; the paper's
encoder block puts its own feed-forward sublayer, residuals and LayerNorms around it, which
here are the Block's.  Computed with the FFT, O(T D log(T D)) time and O(T D) memory
(``sub_quadratic``); the paper's TPU variant multiplies by DFT matrices instead, the same map.
The transform runs in float32 (``torch.fft`` has no bfloat16) and returns the input's dtype.

``fft_norm`` is ``torch.fft``'s ``norm``: ``backward`` (no scaling) is the paper's map;
``ortho`` divides by sqrt(T D), a unitary map -- an addition for pre-norm stacks, where nothing
rescales the unnormalised transform before it joins the residual stream.

What it supports: every output mixes every position, so FNet is bidirectional only (the paper
is an encoder; a causal LM refuses it).  Any length works (``variable_length``): the DFT needs no
``data.seq_len`` fixed at build time.  A key padding mask is honoured by zeroing the padded
positions before the transform, so they add nothing to the others (the paper instead mixes its
pad tokens in).  There are no queries, keys or token pairs: no rotary, no additive bias.
"""

from __future__ import annotations

import torch

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.token_mlp import drop_padding
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION

FFT_NORMS = ("backward", "ortho", "forward")


@ATTENTION.register("fnet")
class FourierMixing(TokenMixer):
    provides = frozenset({"bidirectional", "key_padding_mask", "variable_length"})
    sub_quadratic = True

    def __init__(self, dims: ModelDims, fft_norm: str = "backward"):
        super().__init__()
        del dims  # nothing is sized: no parameters, any length
        if fft_norm not in FFT_NORMS:
            raise ValueError(f"attention.fft_norm={fft_norm!r}: choose one of "
                             f"{', '.join(FFT_NORMS)}")
        self.fft_norm = fft_norm

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        if ctx.causal:
            raise ValueError("attention=fnet mixes every position with every other: it is "
                             "bidirectional only")
        x = drop_padding(x, ctx.key_padding_mask)  # (B, T, D)
        spectrum = torch.fft.fft2(x.float(), dim=(-2, -1), norm=self.fft_norm)  # (B, T, D) complex
        return spectrum.real.to(x.dtype)  # (B, T, D)
