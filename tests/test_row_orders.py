"""Whether a study's rows keep their order between two folders of runs
(:mod:`xformer_bench.results.row_orders`), against hand-worked ranks."""
from __future__ import annotations

import json

import pytest

from xformer_bench.results.record import REQUIRED_KEYS
from xformer_bench.results.row_orders import main

LABELS = {"relu": "ReLU", "gelu": "GeLU", "swiglu": "SwiGLU", "elu": "ELU", "selu": "SeLU"}


def _record(activation, seed, bpb, study="orders"):
    choices = {"model": "vanilla", "attention": "full", "norm": "layernorm",
               "activation": activation, "position": "sinusoidal", "stack": "standard",
               "data": "text", "trainer": "default", "logger": "csv"}
    config = {g: {"name": c, "label": c} for g, c in choices.items()}
    config["activation"]["label"] = LABELS[activation]
    config.update(seed=seed, experiment_name=study, paths={"results_dir": "results"})
    config["trainer"]["max_steps"] = 300
    rec = dict.fromkeys(REQUIRED_KEYS)
    rec.update(schema=2, run_id=f"{study}_{activation}_s{seed}", experiment=study, status="finished",
               choices=choices, overrides=[f"activation={activation}", f"seed={seed}"],
               seed=seed, params=826_000, flops_per_step=1e9, steps_per_sec=5.0,
               early={"val/loss": 2.5}, final={"val/loss": 2.0, "val/bpb": bpb},
               test={"test/bpb": bpb}, task="lm", primary_metric="bpb", eval_unit="bytes",
               metrics=[{"name": "bpb", "title": "bpb", "higher_is_better": False, "digits": 3}],
               eval_counts={}, steps=300, config=config)
    return rec


def _folder(root, means, seeds=(0, 1), study="orders"):
    root.mkdir(parents=True, exist_ok=True)
    for activation, mean in means.items():
        for seed in seeds[activation] if isinstance(seeds, dict) else seeds:
            rec = _record(activation, seed, mean + 0.01 * (seed - 0.5), study)
            (root / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    return root


def test_ranks_rho_and_tau_b_match_a_hand_worked_example(tmp_path, capsys):
    # ranks (1, 2, 3, 4) against (1, 3, 2, 4): sum d^2 = 2, rho = 1 - 6*2 / (4*15) = 0.8;
    # of 6 pairs one is discordant: tau-b = (5 - 1) / 6 = 0.67
    first = _folder(tmp_path / "long" / "records",
                    {"relu": 2.30, "gelu": 2.35, "swiglu": 2.40, "elu": 2.50},
                    seeds={"relu": (0, 1), "gelu": (0, 1), "swiglu": (0,), "elu": (0, 1)})
    second = _folder(tmp_path / "short",
                     {"relu": 3.00, "gelu": 3.20, "swiglu": 3.10, "elu": 3.30, "selu": 3.4})
    assert main([str(first), str(second)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == ["| ReLU | 2.300 | 1 | 3.000 | 1 | +0 |",
                        "| GeLU | 2.350 | 2 | 3.200 | 3 | +1 |",
                        "| SwiGLU | 2.395 | 3 | 3.100 | 2 | -1 |",
                        "| ELU | 2.500 | 4 | 3.300 | 4 | +0 |"]
    assert rows[0].startswith("| Row | long | rank | ")  # a reference is named by its folder
    assert "4 rows in both, by mean text bpb over finished seeds: Spearman's rho 0.80 [" in out
    assert "Kendall's tau-b 0.67" in out
    assert "Only in " in out and ": SeLU." in out
    assert "Fewer seeds than 2 in long: SwiGLU (1)." in out


def test_folders_that_cannot_be_compared_are_one_error_line(tmp_path, capsys):
    two = _folder(tmp_path / "two", {"relu": 2.3, "gelu": 2.4})
    assert main([str(two), str(two)]) == 2
    assert capsys.readouterr().err == "error: only 2 rows are in both: nothing to order\n"
    _folder(tmp_path / "two", {"relu": 2.3, "gelu": 2.4}, study="other")
    assert main([str(two), str(two)]) == 2
    assert "name one with --experiment" in capsys.readouterr().err
    assert main([str(two), str(two), "--experiment", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: no records of nope under ")


@pytest.mark.parametrize("higher", [False, True])
def test_a_higher_is_better_metric_ranks_the_highest_first(tmp_path, capsys, higher):
    means = {"relu": 60.0, "gelu": 62.0, "swiglu": 61.0}
    folders = [_folder(tmp_path / name, means) for name in ("a", "b")]
    for folder in folders:
        for path in folder.glob("*.json"):
            rec = json.loads(path.read_text())
            rec["metrics"][0]["higher_is_better"] = higher
            path.write_text(json.dumps(rec))
    assert main([str(f) for f in folders]) == 0
    rows = [line.split(" | ")[0][2:] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "---" not in line][1:]
    assert rows == (["GeLU", "SwiGLU", "ReLU"] if higher else ["ReLU", "SwiGLU", "GeLU"])
