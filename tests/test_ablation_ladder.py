"""Ablation ladders: the rungs from vanilla to a preset one part at a time
(:mod:`xformer_bench.ladder`), the sweeps that run them (:mod:`xformer_bench.ladder_sweeps`) and
their tables (:mod:`xformer_bench.results.ladder_table`, :mod:`~.ladder_render`)."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import TINY_RUN, choice_groups, compose_config, xbench
from xformer_bench.errors import ConfigError
from xformer_bench.ladder import composed, ladder
from xformer_bench.ladder_sweeps import sweeps
from xformer_bench.results import record as records
from xformer_bench.results.confounds import differences
from xformer_bench.results.ladder_table import gains
from xformer_bench.results.report import make_tables

XL = ["model=vanilla", "+position=xl_relative", "+stack=recurrent",
      "+eval.lanes=10, eval.warm=true"]


def test_the_transformer_xl_ladder_adds_its_position_then_its_memory_then_its_evaluation():
    chain = ladder("transformer_xl")
    assert [r.name for r in chain.rungs] == XL
    assert [r.overrides for r in chain.rungs] == [
        ("model=vanilla",), ("model=vanilla", "position=xl_relative"),
        ("model=vanilla", "position=xl_relative", "stack=recurrent"), ("model=transformer_xl",)]
    assert chain.rungs[-1].part.overrides == ("++eval.lanes=10", "++eval.warm=true")
    # the parts explain the preset: vanilla plus all of them composes to Transformer-XL
    every = [o for r in chain.rungs[1:] for o in r.part.overrides]
    assert differences(composed("model=vanilla", *every), composed("model=transformer_xl"),
                       named=()) == []
    assert compose_config(*chain.rungs[-1].overrides) == compose_config("model=transformer_xl")


def test_a_preset_with_one_difference_has_a_two_rung_ladder():
    chain = ladder("universal_transformer")
    assert [(r.name, r.overrides) for r in chain.rungs] == [
        ("model=vanilla", ("model=vanilla",)),
        ("+stack=universal", ("model=universal_transformer",))]


def test_an_unknown_preset_is_one_error_line(monkeypatch, capsys):
    with pytest.raises(ConfigError, match=r"^no ladder for model=transformr_xl: not a preset "
                                          r"of conf/model/ \(did you mean transformer_xl"):
        ladder("transformr_xl")
    from xformer_bench import cli

    monkeypatch.setattr(sys, "argv", ["xbench", "-m", "experiment=ablate"])  # no preset named
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: experiment=ablate runs the ablation ladder of a model preset, several runs: "
        "xbench -m experiment=ablate model=PRESET"]


def test_systems_lm_runs_its_rows_then_the_rungs_they_lack_once_each():
    planned = sweeps(["-m", "experiment=systems_lm", "seed=0"])
    assert planned[0] == (None, ["-m", "experiment=systems_lm", "seed=0"])
    titles = [title for title, _ in planned[1:]]
    assert titles == [  # vanilla and the presets are rows; Compressive's +position is XL's
        "ladder of transformer_xl, rung 1/3 (+position=xl_relative)",
        "ladder of transformer_xl, rung 2/3 (+stack=recurrent)",
        "ladder of reformer, rung 1/3 (+position=axial)",
        "ladder of reformer, rung 2/3 (+stack=reversible)"]
    assert planned[2][1] == [
        "-m", "experiment=systems_lm", "seed=0", "model=vanilla", "position=xl_relative",
        "stack=recurrent", "++match_params.reference.position=sinusoidal",
        "++match_params.reference.stack=standard",
        "++ladder={system:transformer_xl,rung:2,name:'+stack=recurrent'}",
        "hydra.sweep.subdir=ladder_transformer_xl_2/${hydra:job.num}"]
    ablate = sweeps(["-m", "experiment=ablate", "model=universal_transformer,transformer_xl"])
    assert [argv[2:-2] for _, argv in ablate][:3] == [  # the command line's model replaced
        ["model=vanilla"], ["model=universal_transformer"],
        ["model=vanilla", "position=xl_relative", "++match_params.reference.position=sinusoidal"]]


def test_gains_and_shares_against_a_hand_worked_example():
    # the measured ladder: vanilla 2.439, +xl_relative 1.474, (+recurrent 1.744), XL 1.581
    steps, shares, total = gains([2.439, 1.474, 1.744, 1.581], higher_is_better=False)
    assert total == pytest.approx(0.858)                      # 2.439 - 1.581
    assert steps == [None, pytest.approx(0.965), pytest.approx(-0.270), pytest.approx(0.163)]
    assert shares == [None, pytest.approx(0.965 / 0.858), pytest.approx(-0.270 / 0.858),
                      pytest.approx(0.163 / 0.858)]           # 112.5 %, -31.5 %, 19.0 %
    assert sum(shares[1:]) == pytest.approx(1.0)
    assert gains([0.5, None, 0.7], higher_is_better=True) == ([None, None, None],
                                                              [None, None, None],
                                                              pytest.approx(0.2))


def _record(overrides, seed, bpb, tag):
    """A finished run of ``overrides`` in experiment ablate, its config composed as xbench does
    (``tag``: the ladder rung it was made for, or None)."""
    config = compose_config("experiment=ablate", *overrides, f"seed={seed}")
    config["ladder"] = tag
    rec = dict.fromkeys(records.REQUIRED_KEYS)
    run_id = f"{'_'.join(overrides).replace('=', '-')}_s{seed}"
    rec.update(schema=2, run_id=run_id, experiment="ablate", status="finished", seed=seed,
               overrides=[*overrides, f"seed={seed}"],
               choices={g: config[g]["name"] for g in choice_groups()
                        if "name" in (config.get(g) or {})},
               params=826_000, flops_per_step=1e9, steps_per_sec=5.0, early={"val/loss": 2.6},
               final={"val/loss": 2.1, "val/bpb": bpb}, test={"test/bpb": bpb}, task="lm",
               metrics=[{"name": "bpb", "title": "bpb", "higher_is_better": False, "digits": 3}],
               primary_metric="bpb", eval_unit="bytes", eval_counts={},
               steps=config["trainer"]["max_steps"], config=config,
               eval_protocol={"windows": "streams" if config["eval"]["lanes"] else "windows"})
    return rec


def test_the_ladder_table_shows_each_rungs_gain_share_and_significance(tmp_path):
    folder = tmp_path / "results" / "ablate"
    folder.mkdir(parents=True)
    chain = ladder("transformer_xl", study="ablate")
    means = [2.439, 1.474, 1.744, 1.740]
    for rung, mean in zip(chain.rungs, means):
        # vanilla ran as a row (no ladder tag): a rung's runs are found by their configuration
        tag = chain.tag(rung) if rung.index else None
        for seed, offset in enumerate((-0.01, 0.0, 0.01)):
            rec = _record(rung.overrides, seed, mean + offset, tag)
            (folder / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    make_tables(tmp_path / "results", tmp_path / "tables", plots=False, log=lambda line: None)
    text = (tmp_path / "tables" / "ablate_ladders.md").read_text()
    assert text.splitlines()[:8] == [
        "## ablate: ablation ladder of Transformer-XL", "",
        "| Rung | synthetic bpb | Gain | Share | p | Seeds |", "|:---|---:|---:|---:|---:|---:|",
        "| model=vanilla | 2.439 ± 0.010 | — | — | — | 3 |",
        "| +position=xl_relative | 1.474 ± 0.010 | +0.965† | 138.1 % | 3.1e-08 | 3 |",
        "| +stack=recurrent | 1.744 ± 0.010 | -0.270† | -38.6 % | 5e-06 | 3 |",
        "| +eval.lanes=10, eval.warm=true (= model=transformer_xl) | 1.740 ± 0.010 | +0.004 "
        "| 0.6 % | 0.65 | 3 |"]  # 0.965 / 0.699 = 138.1 %; the last step is within the noise
    assert ("Transformer-XL against Vanilla Transformer, one change at a time: total gain 0.699 "
            "synthetic bpb (lower is better)") in text
    assert "Holm-Bonferroni correction over the ladder's 3 steps (family-wise p < 0.05)" in text
    # the study's own table keeps the baseline and the preset; the rungs between are the ladder's
    main = (tmp_path / "tables" / "ablate.md").read_text()
    assert [line.split(" | ")[0] for line in main.splitlines() if line.startswith("| ")][2:] == [
        "| Vanilla Transformer", "| Transformer-XL"]
    csv_rows = (tmp_path / "tables" / "ablate_ladders.csv").read_text().splitlines()
    assert csv_rows[2].startswith("transformer_xl,1,+position=xl_relative,"
                                  "model=vanilla position=xl_relative,synthetic bpb,")


def test_a_ladder_whose_preset_has_not_run_is_named_by_the_presets_label(tmp_path):
    folder = tmp_path / "results" / "ablate"
    folder.mkdir(parents=True)
    chain = ladder("transformer_xl", study="ablate")
    for rung, mean in zip(chain.rungs[:2], (2.439, 1.474)):  # vanilla and the first rung only
        tag = chain.tag(rung) if rung.index else None
        for seed in range(2):
            rec = _record(rung.overrides, seed, mean + 0.01 * seed, tag)
            (folder / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    make_tables(tmp_path / "results", tmp_path / "tables", plots=False, log=lambda line: None)
    text = (tmp_path / "tables" / "ablate_ladders.md").read_text()
    assert text.startswith("## ablate: ablation ladder of Transformer-XL\n")
    assert ("Transformer-XL against Vanilla Transformer, one change at a time: total gain not "
            "yet measured (lower is better)") in text


def test_one_ladder_runs_end_to_end_with_each_rung_matched_and_tagged(tmp_path):
    result = xbench("-m", "experiment=ablate", "model=universal_transformer", *TINY_RUN,
                    "trainer.max_steps=4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ladder of universal_transformer, rung 1/1 (+stack=universal)" in result.stdout
    done = [records.load(p) for p in sorted((tmp_path / "results" / "ablate").glob("*.json"))]
    assert sorted((r["config"]["ladder"]["rung"], r["choices"]["model"]) for r in done) == [
        (0, "vanilla"), (1, "universal_transformer")]
    assert all(r["config"]["match_params"]["result"]["status"] == "matched" for r in done)
