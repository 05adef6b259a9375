"""Confounds: what a row changes besides what names it, against the study's baseline row
(:mod:`xformer_bench.results.confounds`), over a systems_lm-like study built in tmp_path."""

from __future__ import annotations

import csv
import io
import json
import shutil

import pytest

from conftest import compile_latex
from xformer_bench.results import csv_table, latex, markdown, report
from xformer_bench.results.__main__ import main
from xformer_bench.results.aggregate import build_table
from xformer_bench.results.collect import collect
from xformer_bench.results.record import REQUIRED_KEYS
from xformer_bench.results.variants import group_variants

WINDOWS = {"windows": "non-overlapping", "seq_len": 128, "stride": 128, "min_context": 0}


def streams(lanes, warmup=None):
    return {"windows": "streams", "seq_len": 128, "stride": 128, "min_context": 0,
            "lanes": lanes, "memory": 128, "warmup": warmup}


SYSTEMS = {  # model -> (label, other choices, params, eval protocol, model node extras)
    "vanilla": ("Vanilla Transformer", {}, 826_000, WINDOWS, {}),
    "transformer_xl": ("Transformer-XL", {"position": "xl_relative", "stack": "recurrent"},
                       826_000, streams(10, 384), {}),
    "adaptive_span": ("Adaptive-span Transformer",
                      {"attention": "adaptive_span", "position": "xl_relative",
                       "stack": "recurrent"}, 826_000, streams(8, 384), {}),
    "gtrxl": ("GTrXL", {"position": "xl_relative", "stack": "recurrent"}, 1_680_000,
              streams(16), {"residual": "gru_gate"}),
    "compressive_transformer": ("Compressive Transformer",
                                {"position": "xl_relative", "stack": "compressive"}, 826_000,
                                streams(16), {}),
    "deep_narrow": ("Deep-narrow", {}, 820_000, WINDOWS, {"n_layers": 8, "d_model": 96}),
}
BASE_CHOICES = {"attention": "full", "norm": "layernorm", "position": "sinusoidal",
                "stack": "standard", "data": "text", "trainer": "default", "logger": "csv"}


def record(model, seed=0, experiment="systems_fixture"):
    label, choices, params, protocol, extras = SYSTEMS[model]
    choices = {**BASE_CHOICES, **choices, "model": model}
    config = {g: {"name": c, "label": c.title()} for g, c in choices.items()}
    config["model"] = {"name": model, "label": label, "d_model": 128, "n_layers": 4,
                       "d_ff": 512 if model == "vanilla" else 540, **extras}
    config["stack"].update({"mem_len": None} if choices["stack"] != "standard" else {})
    config["data"].update(seq_len=128, path=f"/data/{model}.txt")  # a path is plumbing
    config.update(seed=seed, experiment_name=experiment, optim={"lr": 3e-3},
                  eval={"lanes": protocol.get("lanes"), "warm": bool(protocol.get("warmup"))},
                  match_params={"reference": {"model": "vanilla"}, "tolerance": 0.05},
                  sweep={"model": list(SYSTEMS), "seed": [0, 1]},
                  paths={"results_dir": "results"}, trainer={"name": "default",
                                                             "progress_bar": seed == 0,
                                                             "max_steps": 300})
    rec = dict.fromkeys(REQUIRED_KEYS)
    rec.update(schema=2, run_id=f"{model}_s{seed}", experiment=experiment, status="finished",
               choices=choices, overrides=[f"model={model}", f"seed={seed}"], seed=seed,
               params=params, flops_per_step=1e9, steps_per_sec=5.0, early={"val/loss": 2.6},
               final={"val/loss": 2.1 + 0.01 * seed, "val/bpb": 3.0 + 0.01 * seed},
               test={"test/bpb": 3.1 + 0.01 * seed + 1e-4 * list(SYSTEMS).index(model)},
               task="lm", metrics=[{"name": "bpb", "title": "bpb", "higher_is_better": False,
                                    "digits": 3}],
               primary_metric="bpb", eval_unit="bytes", eval_counts={}, steps=300,
               config=config, eval_protocol=protocol)
    return rec


def write_study(tmp_path, monkeypatch, models=tuple(SYSTEMS), allowed=None):
    results = tmp_path / "results" / "systems_fixture"
    results.mkdir(parents=True)
    for model in models:
        for seed in (0, 1):
            (results / f"{model}_s{seed}.json").write_text(json.dumps(record(model, seed)))
    study = tmp_path / "systems_fixture.yaml"
    study.write_text("baseline: {model: vanilla}\n"
                     + (f"allowed_differences: {json.dumps(allowed)}\n" if allowed else ""))
    monkeypatch.setattr(report, "study_path", lambda experiment: study)
    return tmp_path / "results"


def table_of(results_dir, allowed=()):
    variants = group_variants(collect(results_dir).of("systems_fixture"))
    return build_table("systems_fixture", variants, {"model": "vanilla"}, tuple(allowed))


def test_the_note_names_each_systems_positions_and_evaluation_protocol(tmp_path, monkeypatch):
    table = table_of(write_study(tmp_path, monkeypatch))
    text = markdown.render(table)
    note = text.strip().splitlines()[-1]
    assert note == (
        "Differences from the baseline row (Vanilla Transformer): "
        "Transformer-XL‡: also position=xl_relative, stack=recurrent; evaluated as streams "
        "(10 lanes, 128 bytes of memory, warmed on 384 bytes); "
        "Adaptive-span Transformer‡: also attention=adaptive_span, position=xl_relative, "
        "stack=recurrent; evaluated as streams (8 lanes, 128 bytes of memory, warmed on 384 "
        "bytes); "
        "GTrXL‡: also position=xl_relative, stack=recurrent, 1.68M parameters (+103% against "
        "826K, beyond the 5% match); evaluated as streams (16 lanes, 128 bytes of memory); "
        "Compressive Transformer‡: also position=xl_relative, stack=compressive; evaluated as "
        "streams (16 lanes, 128 bytes of memory). "
        "‡: differs in what the study does not declare (allowed_differences).")
    # the swept model's own node (its name, label, sizes, re-solved d_ff, GTrXL's gate) and
    # plumbing (paths, progress bar, seed) are never confounds: Deep-narrow differs in nothing else
    assert "Deep-narrow" not in note and "d_ff" not in note and "residual" not in note
    assert "| Deep-narrow |" in text and "| Transformer-XL‡ |" in text


def test_the_protocol_column_appears_only_when_protocols_differ(tmp_path, monkeypatch):
    table = table_of(write_study(tmp_path, monkeypatch))
    titles = [c.title for c in table.columns]
    assert titles[-2:] == ["Eval", "Seeds"]
    row = next(r for r in table.rows if r.label == "Transformer-XL")
    assert row.cells[-2].text == "streams, 10 lanes, memory 128, warm"
    same = table_of(write_study(tmp_path / "same", monkeypatch, ("vanilla", "deep_narrow")))
    assert "Eval" not in [c.title for c in same.columns]
    assert "Differences from the baseline" not in markdown.render(same)


def test_undeclared_differences_warn_once_per_row_declared_ones_do_not(tmp_path, monkeypatch,
                                                                       capsys):
    results = write_study(tmp_path, monkeypatch)
    assert main(["--results-dir", str(results), "--out", str(tmp_path / "t"), "--no-plots"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("warning:")]
    assert warnings == [
        "warning: systems_fixture row 'Transformer-XL' differs from the baseline in undeclared "
        "keys: position, stack, eval protocol",
        "warning: systems_fixture row 'Adaptive-span Transformer' differs from the baseline in "
        "undeclared keys: attention, position, stack, eval protocol",
        "warning: systems_fixture row 'GTrXL' differs from the baseline in undeclared keys: "
        "position, stack, params, eval protocol",
        "warning: systems_fixture row 'Compressive Transformer' differs from the baseline in "
        "undeclared keys: position, stack, eval protocol"]

    shutil.rmtree(tmp_path / "results")
    results = write_study(tmp_path, monkeypatch,
                          allowed=["attention", "position", "stack", "eval_protocol", "params"])
    assert main(["--results-dir", str(results), "--out", str(tmp_path / "t"), "--no-plots"]) == 0
    assert "warning:" not in capsys.readouterr().err
    md = (tmp_path / "t" / "systems_fixture.md").read_text()
    assert "‡" not in md and "Transformer-XL: also position=xl_relative" in md  # still listed


def test_the_csv_has_the_protocol_and_every_difference(tmp_path, monkeypatch):
    table = table_of(write_study(tmp_path, monkeypatch), allowed=["position"])
    rows = {r["variant"]: r for r in csv.DictReader(io.StringIO(csv_table.render(table)))}
    assert rows["GTrXL"]["eval_protocol"] == "streams, 16 lanes, memory 128"
    assert rows["GTrXL"]["undeclared_differences"] == "stack;params;eval protocol"
    assert rows["Vanilla Transformer"]["differences_from_baseline"] == ""
    assert rows["Transformer-XL"]["differences_from_baseline"].startswith(
        "also position=xl_relative, stack=recurrent; evaluated as streams")


def test_an_override_that_is_not_the_rows_name_is_a_confound(tmp_path, monkeypatch):
    results = write_study(tmp_path, monkeypatch, ("vanilla", "deep_narrow"))
    for path in (results / "systems_fixture").glob("deep_narrow_s*.json"):  # the whole row
        changed = json.loads(path.read_text())
        changed["config"]["optim"]["lr"] = 1e-3
        path.write_text(json.dumps(changed))
    row = next(r for r in table_of(results).rows if r.label == "Deep-narrow")
    assert [d.text for d in row.differences] == ["optim.lr=0.001"]


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
def test_the_latex_note_compiles(tmp_path, monkeypatch):
    tex = latex.render(table_of(write_study(tmp_path, monkeypatch)))
    assert r"Transformer-XL$^\ddagger$ &" in tex and r"{\footnotesize Differences" in tex
    (tmp_path / "systems.tex").write_text(tex, encoding="utf-8")
    done = compile_latex(tmp_path, ["systems.tex"])
    assert done.returncode == 0, done.stdout[-2000:]


@pytest.mark.parametrize(("params", "noted"), [(925_000, True), (890_000, False)])
def test_a_parameter_budget_names_a_row_over_it(params, noted):
    """LRA's rule as a study's ``param_budget: 0.10``: a row more than 10 % larger than the
    baseline is named with its ratio; one within the budget is not (no match_params here)."""
    from xformer_bench.results.confounds import differences

    base, row = record("vanilla"), record("deep_narrow")
    for rec in (base, row):
        rec["config"].pop("match_params")
        rec["config"]["param_budget"] = 0.10
    row["params"] = params
    found = [d.text for d in differences(row, base, named=["model"]) if d.name == "params"]
    assert found == (["925K parameters (+12% against 826K, over the study's +10% budget)"]
                     if noted else [])


def test_the_shipped_references_are_not_runs_of_the_results_folder(tmp_path, monkeypatch):
    """results/reference/<name>/records/ holds a shipped study's records: ``make table`` renders
    each reference from its own folder, and the results folder's tables never mix them in."""
    results = write_study(tmp_path, monkeypatch, models=("vanilla",))
    shipped = results / "reference" / "systems_fixture_ref" / "records" / "systems_fixture"
    shipped.mkdir(parents=True)
    (shipped / "transformer_xl_s0.json").write_text(json.dumps(record("transformer_xl")))
    own = report.make_tables(results, tmp_path / "tables", plots=False, log=lambda line: None)
    assert "Transformer-XL" not in (tmp_path / "tables" / "systems_fixture.md").read_text()
    ref = report.make_tables(shipped.parent, shipped.parent.parent, plots=False,
                             log=lambda line: None)
    assert own and ref and "Transformer-XL" in (shipped.parent.parent /
                                                "systems_fixture.md").read_text()


def test_a_modification_bundles_own_changes_name_its_row_anything_else_is_a_confound():
    from xformer_bench.results.confounds import bundle_effects, differences

    def run(modification, **choices):
        choices = {"activation": "gelu", "norm": "layernorm", "data": "text",
                   "modification": modification, **choices}
        config = {g: {"name": c} for g, c in choices.items()}
        config["model"] = {"d_model": 128, "share_blocks": modification == "sharing"}
        return {"choices": choices, "config": config}

    assert bundle_effects("swiglu") == {"activation"}
    assert bundle_effects("sharing") == {"model.share_blocks"}
    base = run("none")
    assert differences(run("swiglu", activation="swiglu"), base, ["modification"]) == []
    assert differences(run("sharing"), base, ["modification"]) == []
    # planted: the same bundle row with another change besides
    found = differences(run("swiglu", activation="swiglu", norm="rmsnorm"), base, ["modification"])
    assert [d.text for d in found] == ["norm=rmsnorm"]


def test_domains_evaluated_in_their_own_ways_are_not_a_protocol_difference():
    from xformer_bench.results.columns import _protocols_differ

    def run(data, protocol):
        return {"choices": {"data": data}, "config": {"data": {"name": data}},
                "eval_protocol": protocol}

    text, listops = run("text", WINDOWS), run("listops", None)
    assert not _protocols_differ([text, listops, dict(text), dict(listops)])
    assert _protocols_differ([text, listops, run("text", streams(10))])  # planted: within text
