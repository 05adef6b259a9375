"""Weighted Transformer (Ahmed, Keskar & Socher 2017, "Weighted Transformer Network for Machine
Translation", section 3): multi-head attention becomes multi-*branch* attention, each head a
branch with its own output projection and feed-forward layer, combined with learned weights::

    head_i      = Attention(Q W^Q_i, K W^K_i, V W^V_i)
    head_i_bar  = head_i W^{O_i} x kappa_i                     W^{O_i} in R^{d_v x d_model}
    BranchedAttention(Q, K, V) = sum_{i=1}^{M} alpha_i FFN_i(head_i_bar)
    FFN_i(x)    = max(0, x W_1,i + b_1,i) W_2,i + b_2,i
    with  sum_i kappa_i = 1,  sum_i alpha_i = 1   (kappa, alpha >= 0: on the simplex)

M = ``model.n_heads`` branches.  The branch FFNs replace the block's feed-forward sublayer, so
the option is used with ``ffn=none`` (``modification=weighted_transformer`` sets both): the
block is ``x + BranchedAttention(N(x))``.  Every part the paper keeps from multi-head attention
(queries, keys, values, the kernel, the position scheme, causal masking, key padding, cached
decoding) is :class:`~xformer_bench.attention.multi_head.MultiHeadAttention`'s.

Choices, named: kappa and alpha are softmaxes of learned logits (starting equal, 1 / M), which
keeps them on the simplex by construction (the paper constrains them to it without saying how
here); ``d_ff_branch`` null gives each FFN_i the inner width ``model.d_ff / M``, so the M branch
FFNs together have the dense layer's weights (set it to ``model.d_ff`` for full-width
branches); W^{O_i} has no bias, as the equation; the decoder's encoder-decoder attention stays
multi-head.
"""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.attention.full import FullAttention
from xformer_bench.errors import ConfigError
from xformer_bench.attention.multi_head import MultiHeadAttention
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.core.init import mark_initialised, small_init_std, wang_init_std
from xformer_bench.registry import ATTENTION


class BranchFeedForward(nn.Module):
    """M position-wise ReLU layers, branch i on input i: (B, M, T, D) -> (B, M, T, D)."""

    def __init__(self, n_branches: int, d_model: int, d_inner: int, n_layers: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_branches, d_model, d_inner))  # W_1,i
        self.b1 = nn.Parameter(torch.zeros(n_branches, 1, d_inner))
        self.w2 = nn.Parameter(torch.empty(n_branches, d_inner, d_model))  # W_2,i
        self.b2 = nn.Parameter(torch.zeros(n_branches, 1, d_model))
        nn.init.normal_(self.w1, std=small_init_std(d_model))  # the house's scales (init.py):
        nn.init.normal_(self.w2, std=wang_init_std(d_model, n_layers))  # W_2,i writes the stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, M, T, D)
        h = torch.relu(torch.einsum("bmtd,mdf->bmtf", x, self.w1) + self.b1)  # (B, M, T, F)
        return torch.einsum("bmtf,mfd->bmtd", h, self.w2) + self.b2  # (B, M, T, D)


class WeightedBranches(MultiHeadAttention):
    decode_state = "none"  # not checked against the forward pass with cached keys

    def __init__(self, dims: ModelDims, d_ff_branch: int | None = None):
        super().__init__(dims, FullAttention(dims))
        m = dims.n_heads
        d_inner = d_ff_branch or max(1, dims.d_ff // m)
        if d_inner < 1:
            raise ConfigError(f"attention.d_ff_branch={d_ff_branch} must be a positive integer")
        self.out = nn.Linear(dims.d_model, dims.d_model, bias=False)  # [W^{O_1}; ...; W^{O_M}]
        nn.init.normal_(self.out.weight, std=small_init_std(dims.d_model))  # feeds FFN_i, not
        mark_initialised(self.out.weight)  # the residual stream: not the residual-output scale
        self.kappa_logits = nn.Parameter(torch.zeros(m))  # (M,)
        self.alpha_logits = nn.Parameter(torch.zeros(m))  # (M,)
        self.branches = BranchFeedForward(m, dims.d_model, d_inner, dims.n_layers)

    def kappa(self) -> torch.Tensor:  # (M,), on the simplex
        return torch.softmax(self.kappa_logits.float(), dim=0)

    def alpha(self) -> torch.Tensor:  # (M,), on the simplex
        return torch.softmax(self.alpha_logits.float(), dim=0)

    def branch_inputs(self, y: torch.Tensor) -> torch.Tensor:  # (B, M, T, Dh) -> (B, M, T, D)
        """head_i_bar = head_i W^{O_i} kappa_i: W^{O_i} is column block i of ``out.weight``."""
        w_out = self.out.weight.t().unflatten(0, (self.n_heads, self.head_dim))  # (M, Dh, D)
        scale = self.kappa().to(y.dtype)[:, None, None]  # (M, 1, 1)
        return torch.einsum("bmtk,mkd->bmtd", y, w_out) * scale

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        branches = self.branches(self.branch_inputs(self.heads(x, ctx)))  # (B, M, T, D)
        return torch.einsum("m,bmtd->btd", self.alpha().to(branches.dtype), branches)


@ATTENTION.register("weighted")
def build(dims: ModelDims, d_ff_branch: int | None = None) -> WeightedBranches:
    return WeightedBranches(dims, d_ff_branch)
