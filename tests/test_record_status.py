"""A record is ``finished`` only if the run measured what it promised: every step it
was asked for and a finite primary metric in validation and test.  Otherwise it is ``failed``
with the reason, one ``error:`` line, and ``make table`` never averages it."""

from __future__ import annotations

import csv
import math

import pytest

from conftest import run_tiny
from xformer_bench.errors import UnmeasuredError
from xformer_bench.metric_spec import BITS_PER
from xformer_bench.results import record as records
from xformer_bench.results.report import make_tables


def _measured(**changes) -> dict:
    """A record of a run that measured what it promised, with ``changes``."""
    record = {"steps": 600, "config": {"trainer": {"max_steps": 600}},
              "final": {"val/bpb": 2.1}, "test": {"test/bpb": 2.2},
              **records.task_fields("lm", [BITS_PER["bytes"]], "bytes")}
    return record | changes


@pytest.mark.parametrize("changes, reason", [
    ({"steps": 0}, "took 0 optimiser steps of trainer.max_steps=600"),
    ({"steps": 599}, "took 599 optimiser steps"),
    ({"final": {"val/bpb": math.nan}}, "final validation bpb is nan"),
    ({"final": None}, "final validation bpb is missing"),
    ({"test": {"test/bpb": math.inf}}, "test bpb is inf"),
    ({"test": None}, "test bpb is missing"),
    ({"metrics": [], "primary_metric": None}, "named no primary metric"),
])
def test_what_a_run_did_not_measure_is_named(changes, reason):
    assert records.unmeasured(_measured()) is None
    assert reason in records.unmeasured(_measured(**changes))


def test_a_translation_that_decodes_at_the_test_only_needs_no_validation_bleu():
    from xformer_bench.tasks.translate import BLEU

    bleu = records.task_fields("translate", [BLEU], "tokens")
    decoded = _measured(**bleu, final={"val/loss": 3.0}, test={"test/bleu": 20.0})
    assert "final validation bleu is missing" in records.unmeasured(decoded)
    assert records.unmeasured(decoded | {"decoding": {"val": "none"}}) is None  # val_bleu=never


def test_runs_that_measured_nothing_are_failed_and_never_averaged(tmp_path):
    """Two ways past the preflight (run in-process, unchecked) to measure nothing: no optimiser
    step (gradients accumulated over zero batches), no validation (none of its batches)."""
    done = run_tiny(tmp_path, "trainer.max_steps=2")
    assert done["status"] == "finished"
    for setting, reason in (("trainer.accumulate_grad_batches=0", "took 0 optimiser steps"),
                            ("trainer.limit_val_batches=0", "final validation bpb is missing")):
        with pytest.raises(UnmeasuredError, match=reason) as error:
            run_tiny(tmp_path, "trainer.max_steps=2", setting)
        assert "\n" not in str(error.value)
    saved = [records.load(p) for p in (tmp_path / "results" / "default").glob("*.json")]
    assert sorted(r["status"] for r in saved) == ["failed", "failed", "finished"]
    assert all("did not measure what it promised" in r["error"]
               for r in saved if r["status"] == "failed")

    tables = make_tables(tmp_path / "results", tmp_path / "tables", plots=False)
    [table] = [p for p in tables if p.suffix == ".csv"]
    rows = list(csv.DictReader(table.read_text().splitlines()))
    [finished] = [row for row in rows if row["seeds_finished"] == "1"]
    assert math.isclose(float(finished["synthetic_bpb"]), done["test"]["test/bpb"], rel_tol=1e-6)
    failed = [row for row in rows if row["seeds_finished"] == "0"]
    assert len(failed) == 2 and all(row["statuses"] == "failed=1" and not row["synthetic_bpb"]
                                    for row in failed)  # shown as failed, averaged nowhere
