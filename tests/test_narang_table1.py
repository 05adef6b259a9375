"""Narang et al.'s Table 1, every row, in one command: ``xbench -m
experiment=narang_table1`` plans one sweep per paper row (:mod:`xformer_bench.paper_rows`), skips
with a note the rows a decoder-only LM refuses and those without an option, and ``make table``
names every one of the 52 rows."""

from __future__ import annotations

import pytest

from conftest import TINY_RUN, choice_groups, compose_config, run_tiny
from xformer_bench.errors import ConfigError
from xformer_bench.ladder_sweeps import sweeps
from xformer_bench.models.build import build_model
from xformer_bench.paper_rows import TAG, one_job, with_row
from xformer_bench.references import load
from xformer_bench.results.record import run_identity

STUDY = ["-m", "experiment=narang_table1"]
LM_REFUSES = ["Encoder only block sharing", "Decoder only block sharing", "Transparent attention"]
"""The rows that need an encoder and a decoder: what the byte LM refuses in one line."""
TINY_DIMS = tuple(o for o in TINY_RUN if o.startswith("model."))


@pytest.fixture(scope="module")
def planned() -> list[tuple[str, list[str]]]:
    return sweeps(STUDY)


def _label(argv: list[str]) -> str:
    tag = next(a for a in argv if a.startswith(f"++{TAG}="))
    return tag.split("=", 1)[1].strip("'").replace("\\'", "'")


def test_every_row_composes_builds_or_is_refused_and_all_52_labels_are_planned(planned):
    table = load("narang2021_table1")
    run = {_label(argv): one_job(argv) for _, argv in planned if argv}
    skipped = [title for title, argv in planned if not argv]
    refused, identities = [], {}
    for row in table.keyed():
        overrides = run.get(row.label) or ["experiment=narang_table1", *row.overrides]
        config = compose_config(*with_row(TINY_DIMS, overrides))
        try:
            build_model(config, 256)
        except ConfigError:
            refused.append(row.label)
            continue
        assert config[TAG] == row.label
        choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
        identities[run_identity(config, choices)] = row.label
    assert refused == LM_REFUSES
    assert sorted(run) == sorted(set(r.label for r in table.keyed()) - set(refused))
    assert len(identities) == len(run)  # no two paper rows are one run (skip_completed)
    assert [t.split("'")[1] for t in skipped] == [*LM_REFUSES, *table.missing()]
    assert all("not run on this assembly" in t for t in skipped[:3])
    assert all("no option yet" in t for t in skipped[3:])
    assert len(run) + len(skipped) == len(table.rows) == 52


def test_rows_run_in_the_papers_order_vanilla_first(planned):
    labels = [_label(argv) for _, argv in planned if argv]
    paper = [row.label for row in load("narang2021_table1").rows]
    assert labels[0] == "Vanilla Transformer"
    assert labels == sorted(labels, key=paper.index)


@pytest.mark.slow
def test_each_row_trains_two_steps_and_the_table_names_all_52_rows(planned, tmp_path):
    from xformer_bench.results.report import make_tables

    runs = [one_job(argv) for _, argv in planned if argv]
    for argv in runs:
        record = run_tiny(tmp_path, *argv, "trainer.max_steps=2", "data.seq_len=16")
        assert record["status"] == "finished", (argv, record.get("error"))
    written = make_tables(tmp_path / "results", tmp_path / "tables", plots=False)
    text = next(p for p in written if p.name == "narang_table1.md").read_text()
    table = load("narang2021_table1")
    rows = [line.split("|")[1].strip() for line in text.splitlines()
            if line.startswith("| ") and not line.startswith(("| Variant", "| :---"))]
    assert [r.replace("\\*", "*").rstrip("‡") for r in rows] == [  # ‡: a confound mark
        r.label for r in table.keyed() if r.label not in LM_REFUSES]
    refused = next(line for line in text.splitlines() if line.startswith("Not run on this"))
    assert all(label in refused for label in LM_REFUSES)
    missing = next(line for line in text.splitlines() if "no option yet" in line)
    assert all(label in missing for label in table.missing())
