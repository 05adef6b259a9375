"""Weight initialisation: the model-wide default, and the way a builder keeps its own.

The model-wide default (:func:`init_weights`) touches only the standard layers a builder
left at PyTorch's defaults -- the weights and biases of ``nn.Linear`` and the tables of
``nn.Embedding`` / ``nn.EmbeddingBag``.  Everything else is the builder's:

* a parameter a module creates itself (``nn.Parameter(...)``: position tables, sub-keys,
  gains) is never touched;
* a standard layer that a builder initialises itself (its paper's scale) is marked with
  :func:`mark_initialised`, and the default skips it.

A test builds every registered variant and checks both rules, so no builder's own
initialisation is silently overwritten.
"""

from __future__ import annotations

import math

import torch
from torch import nn

_MARK = "_xbench_self_initialised"
STANDARD_LAYERS = (nn.Linear, nn.Embedding, nn.EmbeddingBag)
"""Layers whose PyTorch default the model-wide initialisation replaces."""

RESIDUAL_OUTPUTS = ("out", "down")
"""Names of the layers that write a branch's result back to the residual stream."""


def mark_initialised(*params: torch.Tensor) -> None:
    """Mark parameters that their builder initialised itself: the model-wide default skips them."""
    for p in params:
        setattr(p, _MARK, True)


def is_self_initialised(param: torch.Tensor) -> bool:
    return getattr(param, _MARK, False)


def default_initialised(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, parameter)`` of the parameters :func:`init_weights` sets: those of standard
    layers, unmarked, each once (a tied weight is listed under its first owner)."""
    seen: set[int] = set()
    found = []
    for module_name, module in model.named_modules():
        if not isinstance(module, STANDARD_LAYERS):
            continue
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen or is_self_initialised(p):
                continue
            seen.add(id(p))
            found.append((f"{module_name}.{name}", p))
    return found


def small_init_std(d_model: int) -> float:
    """SmallInit (Nguyen & Salazar 2019, "Transformers without Tears"): sqrt(2 / (5 d))."""
    return math.sqrt(2 / (5 * d_model))


def wang_init_std(d_model: int, n_layers: int) -> float:
    """Wang & Komatsuzaki's (2021, GPT-J) residual-output init: 2 / (L sqrt(d))."""
    return 2 / (n_layers * math.sqrt(d_model))


@torch.no_grad()
def init_weights(model: nn.Module, d_model: int, n_layers: int) -> None:
    """GPT-NeoX's scheme (Black et al. 2022, section 2.3.1) for the standard layers: weights
    N(0, :func:`small_init_std`), the residual output projections (``out``, ``down``)
    N(0, :func:`wang_init_std`), biases zero.

    Both scale with the width, unlike GPT-2's fixed N(0, 0.02) (tuned for d = 768 and too
    small for the widths a CPU study uses), and it is what closed most of the gap to
    x-transformers measured (results/reference/baseline_parity_tinyshakespeare/)."""
    std, residual_std = small_init_std(d_model), wang_init_std(d_model, n_layers)
    for name, p in default_initialised(model):
        if name.endswith(".bias"):
            nn.init.zeros_(p)
        else:
            owner = name.rsplit(".", 2)[-2]
            nn.init.normal_(p, std=residual_std if owner in RESIDUAL_OUTPUTS else std)
