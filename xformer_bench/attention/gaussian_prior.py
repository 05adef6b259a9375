"""Attention with a Gaussian locality prior: a learned per-head Gaussian of the distance is
added to the logits, the "prior that models locality" of Lin, Wang, Liu & Qiu 2021 ("A Survey
of Transformers", section 4.4.1), after Yang, Tu, Wong, Meng, Chao & Zhang 2018 ("Modeling
Localness for Self-Attention Networks") and Guo, Zhang & Liu 2019 ("Gaussian
Transformer: A Lightweight Approach for Natural Language Inference"):

    logit_ij = q_i . k_j / sqrt(Dh) + b_ij - (j - i)^2 / (2 sigma_h^2),

with ``b`` the position scheme's additive bias (T5, ALiBi, Shaw) if any, and sigma_h > 0
learned per head (parametrised as log sigma_h, initialised at ``init_sigma``).

**Simplification** (named): Yang et al. predict the centre P_i and the width D_i = 2 sigma_i of
the Gaussian per token; here, as in the survey's form, the centre is the query itself
(P_i = i) and the width is a learned scalar per head.  ``init_sigma`` is our choice: the
papers predict or tune the width per task.

Without ``window`` every pair is computed (dense logits plus the prior, O(T S)).  With
``window`` a query attends only its ``window`` nearest keys -- the previous ``window`` (itself
included) when causal, ``window // 2`` on each side otherwise, as the ``local`` option -- and
the prior is evaluated on the gathered pairs only
(:func:`~xformer_bench.attention._ops.logits.band_attention`): O(T * window), never T x T; a
window that covers every key takes the dense path (a band would gather more keys than there
are).  Pairs outside the window would have had a prior of about -w^2 / (2 sigma^2) (w = the
reach of the window): a truncation that changes little once the window spans a few sigma.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.logits import allowed_pairs, band_attention, plus_distance_term
from xformer_bench.attention._ops.sparse import masked_attention
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


@ATTENTION.register("gaussian_prior")
class GaussianPriorAttention(AttentionKernel):
    def __init__(self, dims: ModelDims, init_sigma: float = 16.0, window: int | None = None):
        super().__init__()
        if init_sigma <= 0:
            raise ValueError(f"attention.init_sigma={init_sigma} must be > 0")
        if window is not None and window < 1:
            raise ValueError(f"attention.window={window} must be >= 1, or null for every pair")
        self.window = window
        self.sub_quadratic = window is not None
        self.log_sigma = nn.Parameter(torch.full((dims.n_heads,), math.log(init_sigma)))  # (H,)

    def sigma(self) -> torch.Tensor:  # (H,)
        return self.log_sigma.exp()

    def prior(self, distance: torch.Tensor) -> torch.Tensor:  # (*S) long -> (H, *S)
        """-(j - i)^2 / (2 sigma_h^2) of the distance j - i."""
        inverse = 0.5 * (-2 * self.log_sigma).exp()  # (H,): 1 / (2 sigma^2)
        return -distance.float().square() * inverse.view(-1, *(1,) * distance.dim())

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
        t, s = q.shape[-2], k.shape[-2]
        biased = plus_distance_term(bias, self.prior, t, s, q.device)
        if self.window is not None:
            before = self.window - 1 if causal else self.window // 2
            after = self.window // 2
            if before < s - 1 or (not causal and after < s - 1):  # else: every key, densely
                return band_attention(q, k, v, before=before, after=after, causal=causal,
                                      bias=biased, key_padding_mask=key_padding_mask)
        valid = allowed_pairs(t, s, causal=causal, key_padding_mask=key_padding_mask,
                              device=q.device)  # (T, S) | (B, 1, T, S)
        logits = biased.dense()  # (H | B,H, T, S): the prior plus the position bias
        if key_padding_mask is not None:  # a row may have no key: zero output, finite
            return masked_attention(q, k, v, valid, logits)[0]  # (B, H, T, Dh)
        mask = logits.masked_fill(~valid, float("-inf")).to(q.dtype)  # every row has its own key
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, Dh)
