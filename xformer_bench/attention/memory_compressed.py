"""Memory-compressed attention (Liu, Saleh, Pot, Goodrich, Sepassi, Kaiser & Shazeer 2018,
"Generating Wikipedia by Summarizing Long Sequences", ICLR, section 4.2.3): "after projecting
the tokens into the query, key, and value embeddings, we reduce the number of keys and values
by using a strided convolution.  The number of queries remains unchanged."  With c the
compression factor, block j of the keys is positions [j c, (j + 1) c) and

    K^c_j = sum_{r < c} W^K_r k_{jc + r} + b^K,    V^c_j = sum_{r < c} W^V_r v_{jc + r} + b^V,

one strided convolution (kernel = stride = c) for the keys and one for the values, each over
all d_model = H Dh channels of the projected heads (the heads' channels mixed, as the paper's
convolution acts on the projected embeddings), Xavier-uniform weights and zero biases
(TensorFlow's defaults, the paper's framework).  Default c = 3 ("convolution kernels of size
3 with stride 3").  A last partial block is zero-padded to c positions.

Bidirectional: every query attends to all S / c compressed blocks.  Causal (the paper's
decoder, T-DMCA, whose masking of the compressed memory the paper does not spell out): a query
at position p of block b = floor(p / c) attends to the compressed blocks j < b -- those that
end before its block -- plus the positions of its own block up to p, uncompressed, all in one
softmax (Mesh TensorFlow's ``multihead_self_attention_memory_compressed`` instead shows a
block once it ends at or before p, so that a query sees nothing of its own block before its
end):

    out_p = softmax_{j < b, b c <= s <= p}([q_p . K^c_j, q_p . k_s] / sqrt(Dh)) [V^c_j, v_s].

Block boundaries are key positions (queries are the last T of S keys).  Cost O(T (S / c + c))
per head: the paper's constant-factor saving on full attention -- the activations divided by
c -- not a sub-quadratic method, so ``sub_quadratic`` is not claimed (at T = 2048 the largest
tensor is T^2 / 3 per head).  The paper alternates these layers with local attention
(T-DMCA); that is a model-level pattern, not this kernel.  Padded keys are zeroed before the
convolution and a block of padding only is not attended.  Not declared: ``additive_bias`` (a
compressed block has no single position).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.sparse import gather_positions
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


def strided_conv(d_model: int, c: int) -> nn.Conv1d:
    conv = nn.Conv1d(d_model, d_model, kernel_size=c, stride=c)
    nn.init.xavier_uniform_(conv.weight)
    nn.init.zeros_(conv.bias)
    return conv


def compress(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """(B, H, S, Dh) -> (B, H, ceil(S / c), Dh): each block of c positions through ``conv``.

    With kernel = stride = c the convolution is one linear map of each block's c x D values,
    computed as such (a matrix product, much faster than a strided convolution on CPU)."""
    b, h, s, dh = x.shape
    d_out, d_in, c = conv.weight.shape
    flat = F.pad(x.transpose(1, 2).reshape(b, s, h * dh), (0, 0, 0, -s % c))  # (B, S', D)
    blocks = flat.view(b, -1, c * d_in)  # (B, n_blocks, c D): block j, offset r, channel
    weight = conv.weight.permute(0, 2, 1).reshape(d_out, c * d_in)  # (D, c D), same order
    return F.linear(blocks, weight, conv.bias).view(b, -1, h, dh).transpose(1, 2)


@ATTENTION.register("memory_compressed")
class MemoryCompressedAttention(AttentionKernel):
    provides = frozenset({"causal", "bidirectional", "longer_keys", "key_padding_mask",
                          "variable_length"})
    sub_quadratic = False

    def __init__(self, dims: ModelDims, compression: int = 3):
        super().__init__()
        if compression < 1:
            raise ConfigError(f"attention=memory_compressed: compression={compression} must be "
                              "positive")
        self.c = compression
        self.compress_k = strided_conv(dims.d_model, compression)
        self.compress_v = strided_conv(dims.d_model, compression)

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
            raise ValueError("attention=memory_compressed takes no additive bias")
        t, s, c = q.shape[-2], k.shape[-2], self.c
        n_blocks = -(-s // c)
        if key_padding_mask is not None:
            padded = key_padding_mask[:, None, :, None]  # (B, 1, S, 1)
            k, v = k.masked_fill(padded, 0.0), v.masked_fill(padded, 0.0)
        keys = compress(k, self.compress_k)  # (B, H, n_blocks, Dh)
        values = compress(v, self.compress_v)  # (B, H, n_blocks, Dh)
        if not causal and key_padding_mask is None:
            return F.scaled_dot_product_attention(q, keys, values)  # (B, H, T, Dh)
        valid = torch.ones(1, 1, 1, n_blocks, dtype=torch.bool, device=q.device)
        if key_padding_mask is not None:  # a block with some key that is not padding
            real = F.pad(~key_padding_mask, (0, n_blocks * c - s))  # (B, n_blocks c)
            valid = real.view(-1, 1, 1, n_blocks, c).any(-1)  # (B, 1, 1, n_blocks)
        scale = q.shape[-1] ** -0.5
        scores = (q @ keys.transpose(-1, -2)) * scale  # (B, H, T, n_blocks)
        if causal:  # compressed blocks before the query's own, then its own block uncompressed
            position = torch.arange(s - t, s, device=q.device)  # (T,) query positions
            own = torch.div(position, c, rounding_mode="floor")  # (T,) query blocks
            valid = valid & (torch.arange(n_blocks, device=q.device) < own[:, None])  # (T, nb)
            local = own[:, None] * c + torch.arange(c, device=q.device)  # (T, c) own block
            local_valid = local <= position[:, None]  # (T, c): up to the query
            local = local.clamp(max=s - 1)
            if key_padding_mask is not None:
                local_valid = local_valid & ~key_padding_mask[:, None, local]  # (B, 1, T, c)
            local_k = gather_positions(k, local)  # (B, H, T, c, Dh)
            local_v = gather_positions(v, local)  # (B, H, T, c, Dh)
            local_scores = (local_k @ q[..., None]).squeeze(-1) * scale  # (B, H, T, c)
            scores = torch.cat([scores, local_scores], -1)  # (B, H, T, n_blocks + c)
            lead = torch.broadcast_shapes(valid.shape[:-1], local_valid.shape[:-1])
            valid = torch.cat([valid.expand(*lead, -1), local_valid.expand(*lead, -1)], -1)
        weights = scores.masked_fill(~valid, torch.finfo(scores.dtype).min).softmax(-1)
        if key_padding_mask is not None:
            weights = weights * valid  # a row with no key at all: 0
        out = weights[..., :n_blocks] @ values  # (B, H, T, Dh)
        if causal:
            out = out + (weights[..., None, n_blocks:] @ local_v).squeeze(-2)  # (B, H, T, Dh)
        return out
