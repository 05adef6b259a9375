"""data.val_subsample: intermediate validations score the split's first batches, the last one and
the test the whole split; training and the final metric are those of a whole-split run."""

from __future__ import annotations

import pytest

from conftest import compose_config, run_tiny
from xformer_bench.results import record as records

SMALL_EVAL = ("data.eval_batch_size=4",)  # 999 validation bytes in 32-byte windows: 8 batches


def test_intermediate_validations_score_the_subsample_and_the_last_the_whole_split(tmp_path):
    whole = run_tiny(tmp_path / "whole", *SMALL_EVAL)
    sub = run_tiny(tmp_path / "sub", *SMALL_EVAL, "data.val_subsample=2")
    assert whole["val_subsample"] is None
    report = sub["val_subsample"]
    assert report["batches"] == 2 and report["whole_split_batches"] == 8
    assert [s["step"] for s in report["scored"]] == [2, 4, 6, 8, 10, 12, 14, 16]
    assert [s["batches"] for s in report["scored"]] == [2] * 7 + [8]
    # the same training (validation draws no random numbers), the same final and test metrics
    assert sub["final"] == whole["final"] and sub["test"] == whole["test"]
    assert sub["eval_counts"] == whole["eval_counts"] == {"val": 999, "test": 999}
    # an intermediate point is scored on fewer bytes, so it is not the whole split's number
    assert sub["early"]["step"] == whole["early"]["step"] == 2
    assert sub["early"]["val/loss"] != whole["early"]["val/loss"]


def test_a_run_whose_steps_are_not_a_multiple_scores_its_last_validation_whole(tmp_path):
    sub = run_tiny(tmp_path, *SMALL_EVAL, "data.val_subsample=1", "trainer.max_steps=15",
                   "trainer.val_checks=4")  # ceil(15 i / 4): 4, 8, 12, 15
    assert sub["val_subsample"]["scored"] == [
        {"step": 4, "batches": 1}, {"step": 8, "batches": 1}, {"step": 12, "batches": 1},
        {"step": 15, "batches": 8}]
    assert sub["final"]["step"] == 15 and sub["eval_counts"]["val"] == 999


def test_a_subsample_larger_than_the_split_scores_the_split(tmp_path):
    sub = run_tiny(tmp_path, *SMALL_EVAL, "data.val_subsample=100", "trainer.val_checks=2")
    assert [s["batches"] for s in sub["val_subsample"]["scored"]] == [8, 8]


def test_the_key_at_null_keeps_older_run_ids_and_a_subsample_is_another_run():
    base = compose_config()
    older = {**base, "data": {k: v for k, v in base["data"].items() if k != "val_subsample"}}
    choices = {"model": "vanilla"}
    assert records.run_identity(base, choices) == records.run_identity(older, choices)
    sub = compose_config("data.val_subsample=4")
    assert records.run_identity(sub, choices) != records.run_identity(base, choices)


@pytest.mark.parametrize("value", ["0", "-1", "1.5"])
def test_an_out_of_range_subsample_is_refused_before_training(value):
    from xformer_bench.schema.validate import check_config

    with pytest.raises(Exception, match="val_subsample"):
        check_config(compose_config(f"data.val_subsample={value}"))
