"""Validations end at the end: ``trainer.val_checks`` of them, evenly spaced, the last
at ``trainer.max_steps`` -- through Lightning (accumulation, epochs that end mid-accumulation,
checkpoints), a real run and its resume, and the caption that says where "final" was."""

from __future__ import annotations

import copy
import signal

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import compose_config, run_tiny
from test_resume import _signal_at
from test_tables import FIXTURES
from xformer_bench.bench.validation_share import Share
from xformer_bench.results import markdown
from xformer_bench.results.aggregate import build_table
from xformer_bench.results.collect import collect
from xformer_bench.results.final_validation import final_at, final_step
from xformer_bench.results.variants import group_variants
from xformer_bench.training.trainer import build_trainer
from xformer_bench.training.validation_history import ValidationHistory
from xformer_bench.training.validation_schedule import validation_steps

SCHEDULES = [  # max_steps, val_checks, the steps validated after
    (300, 8, [38, 75, 113, 150, 188, 225, 263, 300]),
    (7, 3, [3, 5, 7]),
    (1, 8, [1]),
    (10, 1, [10]),
]


@pytest.mark.parametrize("max_steps,val_checks,expected", SCHEDULES)
def test_the_schedule_is_evenly_spaced_and_ends_at_max_steps(max_steps, val_checks, expected):
    assert validation_steps(max_steps, val_checks) == expected


class Quadratic(L.LightningModule):
    """A linear layer on five training and two validation batches of one row each."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.layer(batch).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(torch.randn(5, 2), batch_size=1)  # an odd epoch: it ends mid-accumulation

    def val_dataloader(self):
        return DataLoader(torch.randn(2, 2), batch_size=1)


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("max_steps,val_checks,expected", SCHEDULES)
def test_the_trainer_validates_and_checkpoints_after_exactly_the_scheduled_steps(
        tmp_path, max_steps, val_checks, expected, accumulate):
    options = {"max_steps": max_steps, "val_checks": val_checks, "accelerator": "cpu",
               "accumulate_grad_batches": accumulate, "checkpoint": True, "progress_bar": False}
    history = ValidationHistory()
    trainer = build_trainer(compose_config()["trainer"] | options, [], [history], tmp_path)
    trainer.fit(Quadratic())
    assert trainer.global_step == max_steps
    assert [p["step"] for p in history.points] == expected  # each once, the last at the end
    saved = {p.name for p in (tmp_path / "checkpoints").glob("*.ckpt")}
    assert saved == {f"step-{s}.ckpt" for s in expected} | {"last.ckpt"}


def test_a_run_records_its_last_validation_at_max_steps(tmp_path):
    record = run_tiny(tmp_path, "trainer.max_steps=7", "trainer.val_checks=3")
    assert record["status"] == "finished"
    assert [p["step"] for p in record["history"]] == [3, 5, 7]
    assert record["final"]["step"] == record["final_step"] == 7
    assert record["early"]["step"] == 3  # the validation closest to 7 / 8


def test_a_run_stopped_before_an_unevenly_spaced_validation_resumes_to_it(tmp_path, monkeypatch):
    auto = ("resume=auto", "trainer.max_steps=7", "trainer.val_checks=3",
            "trainer.checkpoint_every=2")
    straight = run_tiny(tmp_path / "straight", *auto)
    with monkeypatch.context() as patch:
        _signal_at(patch, 5, signal.SIGTERM)  # a validation follows step 5: no point there
        with pytest.raises(Exception, match="SIGTERM at step 5"):
            run_tiny(tmp_path / "cut", *auto)
    resumed = run_tiny(tmp_path / "cut", *auto)
    assert resumed["resumed_from"].endswith("step-00000004.ckpt")
    assert resumed["history"] == straight["history"] and resumed["final_step"] == 7


def test_the_validation_share_counts_every_scheduled_validation():
    # 300 steps, 8 checks: 7 intermediate validations of 2 batches and the last of 10
    share = Share("x", seconds_per_step=1.0, seconds_per_batch=1.0, whole_split=10,
                  subsample=2, max_steps=300, val_checks=8)
    assert share.validation_seconds(2) == 7 * 2 + 10


def _finished(step: int | None, max_steps: int, history_steps=(), **keys) -> dict:
    history = [{"step": s, "val/loss": 1.0} for s in history_steps]
    return {"status": "finished", "config": {"trainer": {"max_steps": max_steps}},
            "final": history[-1] if history else None, "history": history, **keys} | (
        {} if step is None else {"final_step": step})


def test_the_final_step_is_the_records_or_its_last_validations():
    assert final_step(_finished(7, 7, [3, 5, 7])) == 7
    assert final_step(_finished(None, 300, [38, 266])) == 266  # an old record
    assert final_step(_finished(None, 300, [38, 266]) | {"final": None}) == 266
    assert final_step(_finished(None, 300)) is None


def test_the_caption_phrase_is_derived_from_the_records():
    assert final_at([_finished(300, 300, [300]), _finished(None, 300, [150, 300])]) \
        == "the last step (300)"
    assert final_at([_finished(None, 300, [38, 266])]) == "step 266 of 300 (the last validation)"
    failed = _finished(None, 300, [38]) | {"status": "diverged"}  # its final is not in the table
    assert final_at([failed, _finished(300, 300, [300])]) == "the last step (300)"
    assert final_at([failed]) == "the last validation"


def test_a_table_whose_runs_validated_last_before_the_end_says_where():
    records = copy.deepcopy([r for r in collect(FIXTURES).records
                             if r["experiment"] == "fixture_activations"])
    for record in records:  # as if each had validated every 300 of 700 steps
        record["config"]["trainer"]["max_steps"] = 700
    text = markdown.render(build_table("fixture_activations", group_variants(records)))
    assert "validation loss on Synthetic at 1/8 of training and at step 600 of 700 " \
           "(the last validation);" in text
    assert "end of training" not in text
