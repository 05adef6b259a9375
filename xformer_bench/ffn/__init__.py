"""Feed-forward sublayers: dense, or sparsely routed (experts, memories).  Builders take
``dims`` and the ``activation`` config node plus the keys of their YAML.

Sublayers are called as ``layer(x, ctx)``; a routed layer adds its auxiliary loss (a scalar
tensor) to ``ctx`` in training, once per application, and the task adds their sum to the
training loss.  It may define ``inactive_parameters()`` (parameters one token does not
use) so that records report active as well as total parameters.

:class:`RoutedExperts` is the mixture-of-experts layer shared by ``moe`` (top-2: Shazeer et al.
2017, "Outrageously Large Neural Networks"; Lepikhin et al. 2020, "GShard") and ``switch``
(top-1: Fedus et al. 2021, "Switch Transformers").  A softmax router scores ``num_experts``
feed-forward layers, each built by the chosen activation (so GLU experts come for free), and
sends every token to its ``top_k`` best.  Each expert takes at most ``capacity`` tokens; the
assignments past it are dropped, and a token with none left gets 0 from the layer, so the
residual carries it through unchanged.

Causality: routing is per token, but capacity dropping depends on which other tokens of the
batch reached the same expert first -- tokens queue in batch order, and under top-2 every
second choice queues behind all first choices, later positions' included.  That is the
standard trade of these layers, and here it is confined to training: in eval every expert
has room for every token, so nothing is dropped and the output at position t depends on
positions <= t of its own sequence only.

Dispatch: in training into fixed buffers of ``capacity`` slots per expert (no host
synchronisation: :meth:`RoutedExperts.dispatch_to_slots`); in evaluation, where the capacity is
every token, each expert on exactly its own tokens (:meth:`RoutedExperts.dispatch`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ACTIVATION


def expert_capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ``capacity_factor`` times an even share of the ``top_k * num_tokens``
    assignments (Fedus et al. 2021, eq. 3; GShard's ``2N/E`` for top-2)."""
    return math.ceil(capacity_factor * top_k * num_tokens / num_experts)


@dataclass
class Assignments:
    """The (token, expert) pairs of one routing, listed choice-major: every token's first
    choice comes before any token's second, so first choices claim capacity first (GShard)."""

    token: torch.Tensor  # (K*N,) index of the routed token
    expert: torch.Tensor  # (K*N,) expert it goes to
    gate: torch.Tensor  # (K*N,) weight of that expert's output
    kept: torch.Tensor  # (K*N,) bool: the expert still had a free slot
    arrival: torch.Tensor  # (K*N,) 0-based place in its expert's queue

    def first_choice(self, num_tokens: int) -> torch.Tensor:  # (N,)
        return self.expert[:num_tokens]


def route(probs: torch.Tensor, top_k: int, capacity: int) -> Assignments:  # probs: (N, E)
    """Pick each token's ``top_k`` experts and keep the assignments that fit in ``capacity``.

    The top-k gates are renormalised to sum to 1 (GShard).  A single choice keeps its raw
    probability instead (Switch): renormalised it would always be 1 and the router would get
    no gradient from the task loss.
    """
    num_tokens, num_experts = probs.shape
    gate, expert = probs.topk(top_k, dim=-1)  # (N, K) each
    if top_k > 1:
        gate = gate / gate.sum(-1, keepdim=True)  # (N, K)
    expert, gate = expert.t().reshape(-1), gate.t().reshape(-1)  # (K*N,) each, choice-major
    token = torch.arange(num_tokens, device=probs.device).repeat(top_k)  # (K*N,)
    one_hot = expert.new_zeros(len(expert), num_experts).scatter_(1, expert[:, None], 1)
    arrival = (one_hot.cumsum(0) * one_hot).sum(-1) - 1  # (K*N,) 0-based place in its queue
    return Assignments(token, expert, gate, arrival < capacity, arrival)


def load_balancing_loss(probs: torch.Tensor, first_choice: torch.Tensor) -> torch.Tensor:
    """Switch's ``E * sum_i f_i * P_i``: ``f_i`` the fraction of tokens whose first choice is
    expert i (before capacity), ``P_i`` the mean router probability of expert i.  It is 1 for a
    uniform router and grows as the load concentrates."""
    num_experts = probs.shape[-1]
    fraction = probs.new_zeros(num_experts).index_add_(  # (E,) tokens per first choice
        0, first_choice, probs.new_ones(first_choice.shape))
    fraction = fraction / first_choice.numel()  # (E,) f_i
    return num_experts * (fraction * probs.mean(0)).sum()


class RoutedExperts(nn.Module):
    """``num_experts`` feed-forward layers behind a softmax router that sends each token to
    its ``top_k`` best, weighted by their gates (see the module docstring)."""

    def __init__(
        self,
        dims: ModelDims,
        activation: Mapping[str, Any],
        num_experts: int,
        top_k: int,
        capacity_factor: float,
        aux_loss_weight: float,
    ):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"ffn.num_experts={num_experts} must be at least top_k={top_k}")
        if capacity_factor <= 0:
            raise ValueError(f"ffn.capacity_factor={capacity_factor} must be positive")
        self.router = nn.Linear(dims.d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(
            ACTIVATION.build(activation, dims=dims) for _ in range(num_experts)
        )
        self.top_k = top_k
        self.capacity_factor = capacity_factor
        self.aux_loss_weight = aux_loss_weight

    def capacity(self, num_tokens: int) -> int:
        """Training drops what exceeds the capacity factor; eval keeps every token (no expert
        can receive a token twice), so evaluation is causal and batch-independent."""
        if not self.training:
            return num_tokens
        return expert_capacity(num_tokens, len(self.experts), self.top_k, self.capacity_factor)

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # (N, D)
        with torch.autocast(tokens.device.type, enabled=False):  # Switch's selective precision:
            logits = F.linear(tokens.float(), self.router.weight.float())  # routed in float32
        probs = logits.softmax(-1)  # (N, E)
        capacity = self.capacity(len(tokens))
        routed = route(probs, self.top_k, capacity)
        if self.training and ctx is not None:  # balancing is a training objective only
            ctx.add_auxiliary_loss(
                self.aux_loss_weight * load_balancing_loss(probs, routed.first_choice(len(tokens))))
        if self.training:
            return self.dispatch_to_slots(tokens, routed, capacity).view_as(x)
        return self.dispatch(tokens, routed).view_as(x)

    def dispatch_to_slots(self, tokens: torch.Tensor, routed: Assignments,
                          capacity: int) -> torch.Tensor:  # (N, D)
        """Training: every expert runs on a buffer of ``capacity`` slots, the token of
        assignment a at slot ``arrival[a]`` of its expert's (an empty slot reads a zero row
        and has gate 0), GShard's and Switch's fixed-shape dispatch: no shape depends on the
        routing, so a GPU step never waits for the host.  The same output as :meth:`dispatch`;
        each expert's matmul is ``capacity`` rows, up to ``capacity_factor`` times its even
        share."""
        n, experts = tokens.shape[0], len(self.experts)
        trash = experts * capacity  # the slot a dropped assignment writes to, then cut
        slot = torch.where(routed.kept, routed.expert * capacity + routed.arrival, trash)
        slot_token = slot.new_full((trash + 1,), n).scatter(0, slot, routed.token)[:trash]
        slot_gate = routed.gate.new_zeros(trash + 1).scatter(0, slot, routed.gate)[:trash]
        padded = torch.cat([tokens, tokens.new_zeros(1, tokens.shape[1])])  # row n: empty
        inputs = padded.index_select(0, slot_token).view(experts, capacity, -1)  # (E, C, D)
        hidden = torch.cat([ffn(rows) for ffn, rows in zip(self.experts, inputs)])  # (E*C, D)
        out = hidden.new_zeros(n + 1, hidden.shape[-1])  # (N + 1, D), row n: the empty slots'
        out = out.index_add(0, slot_token, hidden * slot_gate[:, None].to(hidden.dtype))
        return out[:n]

    def dispatch(self, tokens: torch.Tensor, routed: Assignments) -> torch.Tensor:  # (N, D)
        """Evaluation (every token kept): each expert runs on its own tokens only, and the
        gated outputs are added back in place; the counts are read from the device."""
        expert = routed.expert[routed.kept]  # (M,)
        order = expert.argsort(stable=True)  # group by expert
        token = routed.token[routed.kept][order]  # (M,)
        gate = routed.gate[routed.kept][order]  # (M,)
        counts = torch.bincount(expert, minlength=len(self.experts)).tolist()
        # Every expert runs, on zero rows if it got none, so all parameters join the graph.
        hidden = torch.cat([
            ffn(tokens[rows]) for ffn, rows in zip(self.experts, token.split(counts))
        ])  # (M, D)
        out = hidden.new_zeros(tokens.shape[0], hidden.shape[-1])  # (N, D), 0 for dropped
        return out.index_add(0, token, hidden * gate[:, None].to(hidden.dtype))  # (N, D)

    def inactive_parameters(self) -> int:
        """The experts a token is not sent to: ``(num_experts - top_k)`` experts' weights."""
        per_expert = sum(p.numel() for p in self.experts[0].parameters())
        return (len(self.experts) - self.top_k) * per_expert
