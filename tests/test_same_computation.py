"""Rows that differ only in what they name (:mod:`xformer_bench.results.same_computation`):
found over every runnable row of Narang et al.'s Table 1 as composed, and said under the table."""

from __future__ import annotations

import json

import pytest

from conftest import choice_groups, compose_config
from xformer_bench.results.record import REQUIRED_KEYS, run_identity
from xformer_bench.references import load
from xformer_bench.results.same_computation import computation, same_computation
from xformer_bench.results.variants import Variant

ONE_MODEL = [["Vanilla Transformer", "Tied decoder input and output embeddings"],
             ["Tied encoder/decoder input embeddings", "Untied embeddings"]]
"""On a decoder-only LM (no source table to tie), the two pairs of Table 1 that are one model."""


LM_REFUSES = ("Encoder only block sharing", "Decoder only block sharing", "Transparent attention")


def composed(labels=None) -> list[tuple[str, dict]]:
    """Table 1's rows with an option (``labels``' only), as composed, but those a decoder-only
    LM refuses before training."""
    return [(row.label, compose_config("experiment=narang_table1", *row.overrides))
            for row in load("narang2021_table1").keyed()
            if row.label not in LM_REFUSES and (labels is None or row.label in labels)]


@pytest.fixture(scope="module")
def table1_rows() -> list[tuple[str, dict]]:
    """The two pairs, and rows that change a neighbouring key (the head's tie, the norm, the
    activation)."""
    return composed({*sum(ONE_MODEL, []), "GeLU", "Rezero", "Adaptive input embeddings"})


def variants(rows, task: str, seeds=(0, 1)) -> list[Variant]:
    return [Variant((("row", label),), label,
                    tuple({"config": {**config, "seed": s}, "task": task, "seed": s}
                          for s in seeds))
            for label, config in rows]


def test_the_two_pairs_of_table1_are_one_model_on_an_lm(table1_rows):
    assert len(table1_rows) == 7
    found = [[v.label for v in group] for group in same_computation(variants(table1_rows, "lm"))]
    assert found == ONE_MODEL


@pytest.mark.slow
def test_no_other_rows_of_table1_are_one_model():
    rows = composed()
    assert len(rows) == 47
    found = [[v.label for v in group] for group in same_computation(variants(rows, "lm"))]
    assert found == ONE_MODEL


def test_a_key_the_task_reads_separates_them(table1_rows):
    """On a translation task the source table exists: ``model.tie_encoder_embedding`` counts."""
    pairs = [row for row in table1_rows if row[0] in sum(ONE_MODEL, [])]
    assert same_computation(variants(pairs, "translate")) == []


def test_the_seed_counts_and_a_row_of_mixed_configurations_is_left_alone(table1_rows):
    vanilla, tied = (row for row in table1_rows if row[0] in ONE_MODEL[0])
    assert same_computation([*variants([vanilla], "lm", (0,)), *variants([tied], "lm", (1,))]) \
        == []  # other seeds, no seed in common: not the same computation
    assert computation({"config": {**vanilla[1], "seed": 0}, "task": "lm"}) == \
        computation({"config": {**vanilla[1], "seed": 5}, "task": "lm"})
    wider = {**vanilla[1], "model": {**vanilla[1]["model"], "d_ff": 64}}
    mixed = Variant((), "mixed", ({"config": vanilla[1], "task": "lm", "seed": 0},
                                  {"config": wider, "task": "lm", "seed": 0}))
    assert same_computation([mixed, *variants([tied], "lm", (0,))]) == []


def record_of(config: dict, seed: int) -> dict:
    """A finished run's record of ``config`` (its numbers made up: the table only names rows)."""
    choices = {g: config[g]["name"] for g in choice_groups() if "name" in (config.get(g) or {})}
    record = dict.fromkeys(REQUIRED_KEYS)
    record.update(schema=2, run_id=run_identity({**config, "seed": seed}, choices),
                  experiment="one_model_fixture", status="finished", choices=choices, seed=seed,
                  overrides=[f"modification={config['modification']['name']}", f"seed={seed}"],
                  params=859_000, flops_per_step=1e9, steps_per_sec=5.0,
                  early={"val/loss": 2.6}, final={"val/loss": 2.1, "val/bpb": 3.0 + 0.01 * seed},
                  test={"test/bpb": 3.1 + 0.01 * seed}, task="lm", primary_metric="bpb",
                  metrics=[{"name": "bpb", "title": "bpb", "higher_is_better": False,
                            "digits": 3}], eval_unit="bytes", eval_counts={}, steps=config["trainer"]["max_steps"],
                  config={**config, "seed": seed, "rows_from": None})  # no plan to re-read
    return record


PAIR = {"Untied embeddings", "Tied encoder/decoder input embeddings"}


def tables_of(tmp_path, records) -> tuple[dict[str, str], list[str]]:
    """({file name: text} of the tables ``make table`` writes for ``records``, its log lines)."""
    from xformer_bench.results.report import make_tables

    folder = tmp_path / "results" / "one_model_fixture"
    folder.mkdir(parents=True)
    for record in records:
        (folder / f"{record['run_id']}.json").write_text(json.dumps(record))
    lines: list[str] = []
    written = make_tables(tmp_path / "results", tmp_path / "tables", plots=False,
                          log=lines.append)
    return {p.name: p.read_text() for p in written}, lines


def test_the_table_says_which_rows_are_one_model(tmp_path):
    tables, lines = tables_of(tmp_path, [record_of(config, seed)
                                         for _, config in composed(PAIR) for seed in (0, 1)])
    said = ("One model under two names (configurations equal but for labels and keys this task "
            "does not read: any gap between them is run-to-run noise): Tied encoder/decoder "
            "input embeddings = Untied embeddings.")
    assert said in tables["one_model_fixture.md"]
    tex = tables["one_model_fixture.tex"]
    assert "One model under two names" in tex and "= Untied embeddings." in tex
    assert sum(said in line for line in lines) == 1


def test_the_dry_run_warns_before_anything_trains():
    from xformer_bench.sweep_plan import dry_run_lines

    rows = ["modification=untied_embeddings", "modification=tied_encoder_decoder_embeddings",
            "head.tie=false"]  # the third unties the output too: the same model again
    jobs = [[[row, f"seed={seed}"] for row in [*rows, "activation=gelu"] for seed in (0, 1)]]
    lines = dry_run_lines([("a sweep", ["-m", "..."])], jobs)
    warnings = [line for line in lines if "One model under two names" in line]
    assert len(warnings) == 1 and warnings[0].startswith("[xbench] warning: One model")
    assert warnings[0].endswith("noise): " + " = ".join(rows) + ".")  # gelu is not among them
    assert lines[-1].startswith("[xbench] dry run: 8 jobs: 8 to run")


def test_a_table_set_apart_keeps_its_reason_beside_the_one_model_line(tmp_path):
    """The pair also run at another budget from the command line: that table says both why it
    is apart and which rows are one model (one line once displaced the other)."""
    records = []
    for _, config in composed(PAIR):
        for steps in (config["trainer"]["max_steps"], 7):
            shorter = {**config, "trainer": {**config["trainer"], "max_steps": steps}}
            for seed in (0, 1):
                records.append(record_of(shorter, seed))
                if steps == 7:
                    records[-1]["overrides"].append("trainer.max_steps=7")
    tables, _ = tables_of(tmp_path, records)
    apart = tables["one_model_fixture__max_steps_7.md"]
    assert "Not in the one_model_fixture table: a separate setup: 4 runs" in apart
    assert "One model under two names" in apart
    main = tables["one_model_fixture.md"]
    assert "One model under two names" in main and "Not in the" not in main
