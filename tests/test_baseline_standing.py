"""Whether a study's baseline has learned: its test metric among the n-gram floors and its
improvement over the last 20 % of steps, and the early-learning mark on the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from xformer_bench.results.baseline_standing import floor_place, improvement, standing

FLOORS = {"1": 4.85, "2": 3.61, "3": 3.04, "4": 2.60, "5": 2.38}


def run(test: float, curve: list[tuple[int, float]], rate: float | None = None) -> dict:
    return {"status": "finished", "primary_metric": "bpb", "test": {"test/bpb": test},
            "metrics": [{"name": "bpb", "higher_is_better": False}],
            "history": [{"step": s, "val/bpb": v} for s, v in curve],
            "ngram_floors": {"bits_per_byte": FLOORS, "window": 128},
            "config": {"still_learning": rate}}


def test_the_improvement_is_read_from_the_interpolated_curve():
    curve = [(250, 4.0), (500, 3.0), (1500, 2.6), (1750, 2.5), (2000, 2.45)]
    gained, start, end = improvement([{"step": s, "val/bpb": v} for s, v in curve], "val/bpb",
                                     higher_is_better=False)
    assert (start, end) == (1600, 2000)
    assert gained == pytest.approx(2.6 - 0.4 * 0.1 - 2.45)  # 2.56 at step 1600, by hand
    up = improvement([{"step": 10, "acc": 0.5}, {"step": 20, "acc": 0.7}], "acc", True)
    assert up == (pytest.approx(0.7 - 0.62), 16, 20)  # higher is better: a rise is a gain
    assert improvement([{"step": 1, "val/bpb": 3.0}], "val/bpb", False) is None


def test_a_value_is_placed_between_the_floors():
    assert floor_place(3.13, FLOORS) == ("below the 2-gram floor 3.61, above the 3-gram floor 3.04", 3)
    assert floor_place(2.45, FLOORS) == ("below the 4-gram floor 2.60, above the 5-gram floor 2.38", 5)
    assert floor_place(2.30, FLOORS) == ("below the 5-gram floor 2.38", None)
    assert floor_place(3.70, FLOORS) == ("above the 2-gram floor 3.61", 2)


def test_a_baseline_above_the_trigram_floor_marks_an_early_learning_comparison():
    early = standing([run(3.13, [(213, 3.2), (266, 3.11)])], "Vanilla")
    assert early.early and "above the 3-gram floor" in early.sentence
    assert "still improving" in early.sentence  # 0.09 over the last 20 % of steps


def test_a_learned_baseline_is_not_marked_but_still_described():
    learned = standing([run(2.39, [(1500, 2.43), (1750, 2.41), (2000, 2.40)])] * 2, "Vanilla")
    assert not learned.early
    assert learned.sentence == ("Baseline (Vanilla): test bpb 2.390, below the 4-gram floor "
                                "2.60, above the 5-gram floor 2.38; over the last 20% of its "
                                "steps (1600-2000) validation bpb improved 0.022.")


def test_a_baseline_still_falling_faster_than_the_study_allows_is_marked():
    falling = [(1500, 2.70), (2000, 2.45)]
    assert standing([run(2.45, falling)], "V").early  # 0.2 > the default 0.05
    assert not standing([run(2.45, falling, rate=0.5)], "V").early  # the study's own rate


def test_the_shipped_300_step_activation_table_is_marked_early_learning():
    from xformer_bench.results.aggregate import build_table
    from xformer_bench.results.collect import collect
    from xformer_bench.results.table import caption
    from xformer_bench.results.variants import group_variants

    shipped = Path(__file__).resolve().parent.parent / "results" / "reference"
    records = collect(shipped / "narang_activations_300_steps_tinyshakespeare" / "records")
    runs = [r for r in records.of("narang_activations")
            if r["choices"].get("activation") in ("relu", "gelu")]
    table = build_table("narang_activations", group_variants(runs),
                        baseline={"activation": "relu"})
    text = caption(table, " ± ", "-")
    assert table.early_learning and text.startswith("narang_activations (early-learning ")
    assert "above the 3-gram floor 3.04" in text  # vanilla at 300 steps: about 3.13 bpb
