"""A shipped reference's README gives the command that made its records.  Where the study's
budget has changed since (its records' ``trainer.max_steps`` is not what the study composes
now), the command names the records' budget: re-running it re-runs that comparison, not the
study at its new budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xformer_bench.config import compose_config

REFERENCE = Path(__file__).resolve().parent.parent / "results" / "reference"
FOLDERS = sorted(p for p in REFERENCE.iterdir() if (p / "records").is_dir())


def first_record(folder: Path) -> dict:
    return json.loads(next(iter(sorted((folder / "records").glob("*/*_s*_*.json")))).read_text())


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_a_reference_command_names_a_budget_its_study_no_longer_has(folder):
    record = first_record(folder)
    steps = record["config"]["trainer"]["max_steps"]
    if any(o.startswith("trainer.max_steps=") for o in record["overrides"]):
        return  # the budget was on the command line already: the README's command has it
    now = compose_config(f"experiment={record['experiment']}")["trainer"]["max_steps"]
    if now != steps:
        assert f"trainer.max_steps={steps}" in (folder / "README.md").read_text(), (
            f"{folder.name}: its records ran {steps} steps, experiment={record['experiment']} "
            f"now runs {now}; its README's command must say trainer.max_steps={steps}")
