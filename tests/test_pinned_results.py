"""Seeded tiny runs give the same numbers after a refactor: the pins below were measured at
the commit that added them (the guard: reshaping the house must not move any result;
rel 1e-4 absorbs BLAS differences between CPUs, any real change moves them by far more).

A change that is meant to move results (a new default, a fixed defect) updates the pins in
the same commit and says so in its note.
"""

from __future__ import annotations

import pytest

from conftest import run_tiny

PINNED = {  # overrides -> (final val bpb, test bpb) of a 16-step tiny run, seed 0
    (): (5.798159122467041, 5.909049987792969),
    ("position=rotary", "activation=swiglu", "norm=rmsnorm"): (6.0557541847229, 6.177830696105957),
    ("position=t5", "model.norm_placement=post"): (5.683124542236328, 5.825053691864014),
    ("ffn=switch", "model=shared_blocks"): (5.946911811828613, 6.052760124206543),
}


@pytest.mark.parametrize("overrides", list(PINNED), ids=lambda o: " ".join(o) or "defaults")
def test_a_seeded_run_gives_the_pinned_result(tmp_path, overrides):
    record = run_tiny(tmp_path, *overrides)
    val, test = PINNED[overrides]
    assert record["final"]["val/bpb"] == pytest.approx(val, rel=1e-4)
    assert record["test"]["test/bpb"] == pytest.approx(test, rel=1e-4)
