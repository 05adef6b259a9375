"""Child et al. (2019) Table 2 in one command -- the study composes every row
(pattern x dataset), and a table of its records sets the paper's two datasets beside the
measured ones, as columns, with time per iteration read as a Step/s ratio to dense."""
from __future__ import annotations

import json

import pytest

from xformer_bench import references
from xformer_bench.config import compose_config
from xformer_bench.results import report
from xformer_bench.results.aggregate import build_table
from xformer_bench.results.collect import collect
from xformer_bench.results.record import REQUIRED_KEYS
from xformer_bench.results.variants import group_variants

STUDY = "sparse_transformer_table2"
PATTERNS = ("full", "fixed", "strided")
METRICS = {"enwik8": ("bpb", "bytes"), "cifar10": ("bits_per_dim", "dims")}
MEASURED = {("full", "enwik8"): 2.40, ("fixed", "enwik8"): 2.30, ("strided", "enwik8"): 2.60,
            ("full", "cifar10"): 4.10, ("fixed", "cifar10"): 4.30, ("strided", "cifar10"): 4.00}
SPEED = {"full": 2.0, "fixed": 2.6, "strided": 3.0}


@pytest.mark.parametrize("data", METRICS)
@pytest.mark.parametrize("attention", PATTERNS)
def test_every_row_composes_as_the_sparse_transformer_with_only_its_pattern(attention, data):
    config = compose_config(f"experiment={STUDY}", f"attention={attention}", f"data={data}")
    assert (config["model"]["name"], config["attention"]["name"], config["data"]["name"]) == \
        ("sparse_transformer", attention, data)
    assert config["reference"] == "sparse_transformer2019_table2"
    assert config["trainer"]["max_steps"] == 300


def test_the_reference_is_one_row_per_pattern_with_both_datasets():
    table = references.load("sparse_transformer2019_table2")
    assert [r.overrides for r in table.rows] == [("model=sparse_transformer", f"attention={a}")
                                                 for a in PATTERNS]
    fixed = table.row("Sparse Transformer (Fixed)")
    assert (fixed.value("enwik8_bpb"), fixed.value("cifar10_bits_per_dim")) == (0.99, 2.85)
    assert fixed.value("cifar10_steps_per_sec") == pytest.approx(1 / 0.47, rel=1e-5)


def record(attention, data, seed):
    metric, unit = METRICS[data]
    choices = {"model": "sparse_transformer", "attention": attention, "norm": "layernorm",
               "activation": "gelu", "position": "factorized", "stack": "standard",
               "data": data, "trainer": "default", "logger": "csv"}
    config = {g: {"name": c, "label": c} for g, c in choices.items()}
    config.update(seed=seed, experiment_name=STUDY, paths={"results_dir": "results"})
    config["trainer"]["max_steps"] = 300
    value = MEASURED[attention, data] + 0.002 * (seed - 1)
    rec = dict.fromkeys(REQUIRED_KEYS)
    rec.update(schema=2, run_id=f"{attention}_{data}_s{seed}", experiment=STUDY,
               status="finished", choices=choices, seed=seed, params=800_000,
               overrides=[f"attention={attention}", f"data={data}", f"seed={seed}"],
               flops_per_step=1e9, steps_per_sec=SPEED[attention] + 0.01 * (seed - 1),
               early={"val/loss": value + 0.3},
               final={"val/loss": value, f"val/{metric}": value},
               test={f"test/{metric}": value}, task="lm", primary_metric=metric,
               metrics=[{"name": metric, "title": metric, "higher_is_better": False,
                         "digits": 3}], eval_unit=unit, eval_counts={}, steps=300, config=config)
    return rec


def test_the_table_sets_each_dataset_beside_its_paper_column(tmp_path, monkeypatch):
    folder = tmp_path / "results" / STUDY
    folder.mkdir(parents=True)
    for (attention, data) in MEASURED:
        for seed in (0, 1, 2):
            path = folder / f"{attention}_{data}_s{seed}.json"
            path.write_text(json.dumps(record(attention, data, seed)))
    study = tmp_path / f"{STUDY}.yaml"
    study.write_text("baseline: {attention: full}\nreference: sparse_transformer2019_table2\n")
    monkeypatch.setattr(report, "study_path", lambda experiment: study)
    variants = group_variants(collect(tmp_path / "results").of(STUDY))
    table = build_table(STUDY, variants, report.study_baseline(STUDY), (),
                        report.study_reference(STUDY))
    keys = [c.key for c in table.columns]
    for key in ("enwik8_bpb_paper", "cifar10_bits_per_dim_paper", "steps_per_sec_paper"):
        assert keys.index(key) == keys.index(key[:-len("_paper")]) + 1
    rows = {row.label: dict(zip(keys, row.cells)) for row in table.rows}
    fixed = next(v for k, v in rows.items() if "ixed" in k)
    strided = next(v for k, v in rows.items() if "trided" in k)
    assert fixed["enwik8_bpb_paper"].mean == 0.99 and fixed["cifar10_bits_per_dim_paper"].mean == 2.85
    assert fixed["steps_per_sec_paper"].mean == pytest.approx(0.54 / 0.47)
    assert fixed["enwik8_bpb_paper"].agreement == "agrees"            # both below dense
    assert fixed["cifar10_bits_per_dim_paper"].agreement == "agrees"  # both above dense
    assert strided["enwik8_bpb_paper"].agreement == "agrees"          # both above dense
    assert strided["cifar10_bits_per_dim_paper"].agreement == "agrees"  # both below dense
    assert strided["steps_per_sec_paper"].agreement == "agrees"       # both faster
