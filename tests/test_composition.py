"""Every option composes with every other: a seeded sample of the cross product of the
component groups, plus every option of every group at least once, each trained 2 steps."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.nn.functional as F

from conftest import compose_config
from xformer_bench.config import CONF_DIR, PLUMBING_GROUPS, choice_groups
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model

GROUPS = tuple(g for g in choice_groups() if g not in PLUMBING_GROUPS)  # model-shaping groups
OPTIONS = {g: sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml")) for g in GROUPS}
SMALL = ("data.seq_len=16", "model.d_model=32", "model.n_heads=2", "model.d_ff=64")
# Declared incompatibilities: building them is a one-line ConfigError before training.
INCOMPATIBLE = [{"norm": "fixup", "ffn": "product_key_memory"},
                {"norm": "powernorm", "model": "shared_blocks"}]


def _combinations(n_random: int = 12, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    width = max(len(options) for options in OPTIONS.values())
    # Latin-style cover: combination i takes option i of every group (cycled), so every option
    # of every group appears at least once; then random draws from the full cross product.
    cover = [{g: OPTIONS[g][i % len(OPTIONS[g])] for g in GROUPS} for i in range(width)]
    sample = [{g: rng.choice(OPTIONS[g]) for g in GROUPS} for _ in range(n_random)]
    return cover + sample


def test_the_cover_includes_every_option_of_every_group():
    combos = _combinations()
    for group, options in OPTIONS.items():
        assert {c[group] for c in combos} == set(options)
    total = 1
    for options in OPTIONS.values():
        total *= len(options)
    assert total == len(list(itertools.product(*OPTIONS.values())))


@pytest.mark.parametrize("combo", _combinations(), ids=lambda c: "-".join(c.values()))
def test_combination_builds_and_trains_two_steps(combo):
    config = compose_config(*(f"{g}={o}" for g, o in combo.items()), *SMALL)
    torch.manual_seed(0)
    if any(all(combo[g] == o for g, o in pair.items()) for pair in INCOMPATIBLE):
        with pytest.raises(ConfigError, match="choose another"):
            build_model(config, vocab_size=256)
        return
    model = build_model(config, vocab_size=256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(2):
        log_p = model(tokens[:, :-1])  # (B, T, V)
        loss = F.nll_loss(log_p.flatten(0, 1), tokens[:, 1:].flatten())
        auxiliary = model.auxiliary_loss()
        (loss if auxiliary is None else loss + auxiliary).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[1] != losses[0], "the step must change the model"
