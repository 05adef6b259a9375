"""Run records -> tables and plots (``make table``), on the records in tests/fixtures/records.

fixture_activations: ReLU (seed 2 diverged), GeLU (3 seeds, plus a stale copy of seed 0),
SwiGLU (1 seed, no FLOP count), GeGLU (2 diverged + 1 failed), a corrupt and a partial file.
fixture_positions: two positions on synthetic (learned: seed 1 interrupted) and enwik8.
Both are schema-1 records, read as schema 2: their goldens guard the upgrade.
fixture_tasks (schema 2): ReLU and GeLU on three tasks -- byte LM on synthetic (bpb), pixel LM
on cifar10 (bits/dim), classification on cifar10_classify (top-1 and top-5, higher is better).
Set XBENCH_UPDATE_GOLDEN=1 to rewrite tests/golden/ after an intended change.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import compile_latex
from xformer_bench.results import latex, markdown
from xformer_bench.results.__main__ import main
from xformer_bench.results.aggregate import build_table
from xformer_bench.results.collect import collect
from xformer_bench.results.table import si
from xformer_bench.results.variants import group_variants, repeated_seeds

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures" / "records"
GOLDEN = HERE / "golden"
BLEU = {"name": "bleu", "title": "BLEU", "higher_is_better": True, "digits": 1}
EXPERIMENTS = ("fixture_activations", "fixture_positions", "fixture_tasks")


@pytest.fixture(scope="module")
def found():
    return collect(FIXTURES)


def table_of(records, experiment="x"):
    return build_table(experiment, group_variants(records))


def cells(table, label):
    """{column title: cell} of the row labelled ``label``."""
    row = next(r for r in table.rows if r.label == label)
    return {c.title: cell for c, cell in zip(table.columns, row.cells)}


def test_corrupt_and_partial_files_are_skipped_and_the_newest_duplicate_kept(found):
    assert sorted(s.path.name for s in found.skipped) == ["corrupt.json", "partial.json"]
    assert "lacks" in next(s.reason for s in found.skipped if s.path.name == "partial.json")
    assert [p.parent.name for p in found.duplicates] == ["stale"]
    kept = [r for r in found.records if r["run_id"] == found.duplicates[0].stem]
    assert len(kept) == 1 and kept[0]["final"]["val/loss"] == 2.217  # not the stale 2.9
    assert found.experiments() == list(EXPERIMENTS)


def test_a_record_of_the_wrong_shape_is_skipped(tmp_path):
    record = json.loads(next((FIXTURES / "fixture_positions").glob("*.json")).read_text())
    (tmp_path / "good.json").write_text(json.dumps(record))
    (tmp_path / "list.json").write_text("[1, 2]")
    record.update(run_id="other", choices="gelu")
    (tmp_path / "bad.json").write_text(json.dumps(record))
    found = collect(tmp_path)
    assert {s.path.name: s.reason for s in found.skipped} == {
        "bad.json": "'choices' is a str", "list.json": "a JSON list, not a run record"}
    assert len(found.records) == 1


def test_means_and_sample_stds_equal_numpy_over_finished_seeds_only(found):
    table = table_of(found.of("fixture_activations"))
    expected = {  # (row, column): the finished seeds' values, seed order
        ("GeLU", "Final loss"): [2.217, 2.221, 2.210],
        ("GeLU", "synthetic bpb"): [3.2298, 3.2350, 3.2201],
        ("GeLU", "Step/s"): [6.28, 6.31, 6.25],
        ("ReLU", "Early loss"): [2.700, 2.720],  # the diverged seed's 2.9 is left out
        ("ReLU", "Final loss"): [2.250, 2.262],
    }
    for (label, column), values in expected.items():
        row = cells(table, label)
        assert row[column].mean == pytest.approx(np.mean(values), rel=1e-12, abs=0)
        assert row[column].std == pytest.approx(np.std(values, ddof=1), rel=1e-12, abs=0)
        assert row[column].n == len(values)
    swiglu = cells(table, "SwiGLU")
    assert (swiglu["Final loss"].mean, swiglu["Final loss"].std) == (2.190, None)


def test_seeds_column_counts_finished_of_total(found):
    table = table_of(found.of("fixture_activations"))
    seeds = {r.label: cells(table, r.label)["Seeds"].text for r in table.rows}
    assert seeds == {"ReLU": "2/3", "GeLU": "3", "SwiGLU": "1", "GeGLU": "0/3"}
    relu = next(r for r in table.rows if r.label == "ReLU")
    assert (relu.finished, relu.total, relu.statuses) == (2, 3, "finished=2;diverged=1")


def test_a_variant_without_finished_runs_shows_its_status(found):
    geglu = cells(table_of(found.of("fixture_activations")), "GeGLU")
    for column in ("Step/s", "Early loss", "Final loss", "synthetic bpb"):
        assert (geglu[column].mean, geglu[column].text) == (None, "diverged/failed")
    assert geglu["Params"].mean == 891648  # a property of the configuration, still known
    assert "| GeGLU | 892K | 25.6G | diverged/failed |" in markdown.render(
        table_of(found.of("fixture_activations")))


def test_best_value_is_bold_lower_or_higher_per_metric(found):
    table = table_of(found.of("fixture_activations"))
    bold = {c.title: [r.label for r in table.rows if r.cells[i].bold]
            for i, c in enumerate(table.columns)}
    assert bold["Final loss"] == ["SwiGLU"] and bold["Early loss"] == ["SwiGLU"]
    assert bold["synthetic bpb"] == ["GeLU"]
    assert bold["Params"] == bold["Step/s"] == bold["Seeds"] == []
    # BLEU, declared higher-is-better by the record
    records = copy.deepcopy(found.of("fixture_positions"))
    for record in records:
        learned, interrupted = record["choices"]["position"] == "learned", \
            record["status"] == "interrupted"
        record["choices"]["data"] = "wmt"
        record["config"]["data"] = {"name": "wmt"}  # one dataset: one setting, no split
        record.update(metrics=[BLEU], primary_metric="bleu")
        record["test"] = {"test/bleu": 90.0 if interrupted else 20.0 if learned else 25.0}
    wmt = table_of(records)
    assert [c.title for c in wmt.columns if c.title.startswith("wmt")] == ["wmt BLEU"]
    assert "| **25.0 ± 0.0** |" in markdown.render(wmt)  # the digits the spec declares
    best = [r.label for r in wmt.rows if cells(wmt, r.label)["wmt BLEU"].bold]
    assert best == ["Sinusoidal"]  # 25 > 20 (the interrupted 90 is not averaged in)


def test_missing_values_are_dashes(found):
    table = table_of(found.of("fixture_activations"))
    assert cells(table, "SwiGLU")["Ops"].missing  # finished, but its FLOPs not counted
    assert "| SwiGLU | 892K | — | 5.90 | **2.600** | **2.190** | 3.295 | 1 |" in \
        markdown.render(table)
    assert r"SwiGLU & 892K & -- & 5.90 & \textbf{2.600} & \textbf{2.190} & 3.295 & 1 \\" in \
        latex.render(table)


def test_rows_follow_the_declared_sweep_else_the_labels(found):
    assert [r.label for r in table_of(found.of("fixture_activations")).rows] == \
        ["ReLU", "GeLU", "SwiGLU", "GeGLU"]  # config.sweep order, not alphabetical
    assert [r.label for r in table_of(found.of("fixture_positions")).rows] == \
        ["Learned absolute", "Sinusoidal"]


def test_row_labels_join_what_varies(found):
    gelu_only = [r for r in found.of("fixture_activations") if r["choices"]["activation"] == "gelu"]
    assert [r.label for r in table_of(gelu_only).rows] == ["Vanilla Transformer"]
    mixed = copy.deepcopy(found.of("fixture_positions"))
    for record in mixed[:2]:
        record["choices"]["activation"] = "relu"
        record["config"]["activation"] = {"name": "relu", "label": "ReLU"}
    labels = {r.label for r in table_of(mixed).rows}
    assert "ReLU, Learned absolute" in labels and "GeLU, Sinusoidal" in labels
    # an override that changes the configuration is a different row, never an extra seed
    lr = copy.deepcopy(gelu_only)
    lr[0]["overrides"].append("optim.lr=0.001")
    assert sorted(r.label for r in table_of(lr).rows) == ["Vanilla Transformer", "optim.lr=0.001"]
    assert repeated_seeds(group_variants(lr)) == []
    # a study's declarations (its sweep list, match request) never make a row of their own
    narrowed = copy.deepcopy(gelu_only)
    narrowed[0]["overrides"] += ['sweep.attention="full,local"', "match_params.tolerance=0.05"]
    assert [r.label for r in table_of(narrowed).rows] == ["Vanilla Transformer"]


def test_a_seed_run_twice_in_one_variant_is_warned_about(found):
    gelu = [r for r in found.of("fixture_activations") if r["choices"]["activation"] == "gelu"]
    rerun = copy.deepcopy(gelu[0])
    rerun["run_id"] += "_after_a_default_changed"
    warnings = repeated_seeds(group_variants([*gelu, rerun]))
    assert len(warnings) == 1 and "2 runs of seed 0 on synthetic" in warnings[0]


def test_one_metric_column_per_dataset_with_losses_from_the_main_one(found):
    table = table_of(found.of("fixture_positions"))
    assert [c.title for c in table.columns] == [
        "Params", "Ops", "Step/s", "Early loss", "Final loss", "synthetic bpb", "enwik8 bpb",
        "Seeds"]
    assert table.loss_data == "Synthetic"  # the dataset with the most runs
    assert cells(table, "Learned absolute")["enwik8 bpb"].missing
    assert cells(table, "Sinusoidal")["enwik8 bpb"].mean == 1.45
    assert cells(table, "Sinusoidal")["Seeds"].text == "2"  # synthetic runs only


def test_what_differs_only_between_datasets_describes_the_column_not_the_row(found):
    """Per-domain sizes (and a preset per domain) keep one row per variant; what differs
    within one dataset still splits rows."""
    records = copy.deepcopy(found.of("fixture_tasks"))
    for record in records:
        record["overrides"].append(f"data.batch_size={len(record['choices']['data'])}")
        if record["choices"]["data"] == "cifar10":
            record["choices"]["model"] = "image_transformer"
    assert [r.label for r in table_of(records).rows] == \
        [r.label for r in table_of(found.of("fixture_tasks")).rows]
    records[0]["overrides"].append("optim.lr=0.001")
    assert len(table_of(records).rows) == len(table_of(found.of("fixture_tasks")).rows) + 1


def test_equally_run_datasets_come_in_the_order_the_sweep_declares(found):
    records = copy.deepcopy(found.of("fixture_positions"))
    runs = {}
    for record in records:
        runs.setdefault(record["choices"]["data"], []).append(record)
    synthetic, enwik8 = runs["synthetic"][:len(runs["enwik8"])], runs["enwik8"]
    for record in synthetic + enwik8:
        record["config"]["sweep"] = {"data": "synthetic,enwik8"}
    table = table_of(enwik8 + synthetic)
    assert table.loss_data == "Synthetic"  # a tie broken by the sweep, not by name
    assert [c.title for c in table.columns][-3:] == ["synthetic bpb", "enwik8 bpb", "Seeds"]


def test_active_params_column_appears_only_for_routed_models(found):
    records = copy.deepcopy(found.of("fixture_positions"))
    assert "Active params" not in [c.title for c in table_of(records).columns]
    for record in records:
        if record["choices"]["position"] == "learned":
            record["active_params"] = 500_000
    active = cells(table_of(records), "Learned absolute")["Active params"]
    assert active.mean == 500_000


def test_memory_columns_show_measured_step_memory_and_gpu_peaks_only(found):
    """A CPU resident set (the process's libraries, earlier runs' caches) is never shown as a
    run's memory; a GPU run's own peak is, and so is the step memory every run measures."""
    records = copy.deepcopy(found.of("fixture_positions"))
    titles = [c.title for c in table_of(records).columns]
    assert "Peak MiB" not in titles and "Step MiB" not in titles
    for i, record in enumerate(records):
        record.update(peak_memory_kind="cpu_peak_rss", peak_memory_mb=900.0 + i)
    assert "Peak MiB" not in [c.title for c in table_of(records).columns]
    for i, record in enumerate(records):
        if record["choices"]["position"] == "learned" and record["status"] == "finished":
            record.update(peak_memory_kind="cuda_max_allocated", peak_memory_mb=100.0 + 10 * i,
                          step_memory_mb=12.5)
    gpu = [r["peak_memory_mb"] for r in records if r["peak_memory_kind"] == "cuda_max_allocated"]
    table = cells(table_of(records), "Learned absolute")
    assert table["Peak MiB"].mean == pytest.approx(np.mean(gpu))
    assert table["Step MiB"].mean == 12.5
    assert cells(table_of(records), "Sinusoidal")["Peak MiB"].mean is None
    why = "Peak MiB: — where the runs trained on a CPU"
    assert any(why in n for n in table_of(records).notes)  # the CPU rows' empty cells said
    for record in records:
        if record["peak_memory_kind"] == "cpu_peak_rss":
            record.update(peak_memory_kind=None, peak_memory_mb=None)  # not measured
    assert not any(why in n for n in table_of(records).notes)


def test_tasks_side_by_side_take_titles_and_directions_from_their_specs(found):
    """Classification (higher is better) and pixel LM next
    to byte LM in one table."""
    table = table_of(found.of("fixture_tasks"))
    assert [c.title for c in table.columns][5:] == [
        "synthetic bpb", "cifar10_classify top-1 (%)", "cifar10_classify top-5 (%)",
        "cifar10 bits/dim", "Seeds"]
    bold = {c.title: [r.label for r in table.rows if r.cells[i].bold]
            for i, c in enumerate(table.columns)}
    assert bold["cifar10_classify top-1 (%)"] == ["ReLU"]  # 61.5 > 60.3: highest wins
    assert bold["cifar10_classify top-5 (%)"] == ["GeLU"]  # 91.2 > 90.3
    assert bold["synthetic bpb"] == bold["cifar10 bits/dim"] == ["GeLU"]  # lowest wins
    relu = cells(table, "ReLU")
    top1 = relu["cifar10_classify top-1 (%)"]
    assert (top1.mean, top1.std) == (pytest.approx(61.5), pytest.approx(np.std([61.2, 61.8],
                                                                                ddof=1)))
    assert relu["cifar10 bits/dim"].mean == 3.512 and relu["cifar10 bits/dim"].std is None
    assert table.loss_data == "Synthetic"  # the dataset with the most runs
    assert "| ReLU | 826K | 23.4G | 6.43 ± 0.04 | 2.710 ± 0.014 | 2.255 ± 0.007 | " \
        "3.285 ± 0.007 | **61.50 ± 0.42** | 90.30 ± 0.28 | 3.512 | 2 |" in markdown.render(table)
    assert r"cifar10\_classify top-1 (\%)" in latex.render(table)


def test_a_column_is_a_dataset_and_a_metric_never_a_dataset_alone(found):
    records = copy.deepcopy(found.of("fixture_tasks"))
    for record in records:  # both CIFAR-10 tasks on one data choice: still two columns
        if record["choices"]["data"].startswith("cifar10"):
            record["choices"]["data"] = "cifar10"
    titles = [c.title for c in table_of(records).columns]
    assert "cifar10 bits/dim" in titles and "cifar10 top-1 (%)" in titles


def test_si_formatting():
    assert [si(826112), si(23353884672), si(999_999), si(512), si(1.2e12)] == \
        ["826K", "23.4G", "1M", "512", "1.2T"]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_markdown_equals_golden(found, experiment):
    rendered = markdown.render(table_of(found.of(experiment), experiment))
    golden = GOLDEN / f"{experiment}.md"
    if os.environ.get("XBENCH_UPDATE_GOLDEN"):
        golden.write_text(rendered, encoding="utf-8")
    assert rendered == golden.read_text(encoding="utf-8")


def test_latex_is_booktabs_and_escaped(found):
    tex = latex.render(table_of(found.of("fixture_activations"), "fixture_activations"))
    lines = tex.splitlines()
    assert lines.index(r"\toprule") < lines.index(r"\midrule") < lines.index(r"\bottomrule")
    assert r"\caption{fixture\_activations: mean $\pm$ std" in tex
    assert "±" not in tex and "—" not in tex
    assert latex.escape("a_b & 50% #1 $x$ {y} ~^\\") == (
        r"a\_b \& 50\% \#1 \$x\$ \{y\} \textasciitilde{}\textasciicircum{}\textbackslash{}")


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
def test_latex_compiles(found, tmp_path):
    for experiment in EXPERIMENTS:
        (tmp_path / f"{experiment}.tex").write_text(
            latex.render(table_of(found.of(experiment), experiment)), encoding="utf-8")
    done = compile_latex(tmp_path, [f"{e}.tex" for e in EXPERIMENTS])
    assert done.returncode == 0, done.stdout[-2000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 0


def test_command_writes_tables_and_plots_identically_twice(tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(FIXTURES, results)
    decoy = json.loads(next((FIXTURES / "fixture_positions").glob("*.json")).read_text())
    decoy.update(experiment="decoy", run_id="decoy")
    (results / "tables").mkdir()  # the output folder is never read as records
    (results / "tables" / "decoy.json").write_text(json.dumps(decoy))
    assert main(["--results-dir", str(results)]) == 0
    err = capsys.readouterr().err
    assert "corrupt.json" in err and "partial.json" in err and "older record" in err
    out = results / "tables"
    tables = sorted(p.name for p in out.iterdir() if p.suffix in (".md", ".tex", ".csv"))
    assert tables == sorted(f"{e}.{s}" for e in EXPERIMENTS for s in ("csv", "md", "tex"))
    first = {name: (out / name).read_bytes() for name in tables}
    plots = {e: ["curves"] for e in EXPERIMENTS}
    plots["fixture_activations"].append("tradeoff")  # no calibrated speed: against its params
    for experiment, kinds in plots.items():  # params alike, no baseline: no trade-off, no delta
        for kind in kinds:
            png, pdf = (out / f"{experiment}_{kind}.{s}" for s in ("png", "pdf"))
            assert png.read_bytes()[:4] == b"\x89PNG" and pdf.read_bytes()[:4] == b"%PDF"
    assert sorted(p.name for p in out.glob("*.png")) == sorted(
        f"{e}_{kind}.png" for e, kinds in plots.items() for kind in kinds)
    assert (out / "fixture_activations.md").read_text() == \
        (GOLDEN / "fixture_activations.md").read_text()
    assert main(["--results-dir", str(results), "--no-plots"]) == 0
    assert {name: (out / name).read_bytes() for name in tables} == first


def test_command_errors(tmp_path, capsys):
    assert main(["--results-dir", str(FIXTURES), "--out", str(tmp_path),
                 "--experiment", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["--results-dir", str(tmp_path / "empty"), "--out", str(tmp_path)]) == 1
    assert main(["--results-dir", str(FIXTURES), "--out", str(tmp_path), "--no-plots",
                 "--experiment", "fixture_positions"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fixture_positions.csv", "fixture_positions.md", "fixture_positions.tex"]


def test_rows_of_a_swept_preset_are_named_by_the_preset_unless_that_is_ambiguous():
    from xformer_bench.results.variants import _naming_facets

    groups, varying = ["model", "attention", "stack"], ["model", "attention", "stack"]
    keys = [(("model", "vanilla"), ("attention", "full"), ("stack", "standard")),
            (("model", "reformer"), ("attention", "lsh"), ("stack", "reversible"))]
    assert _naming_facets(keys, varying, groups, {"model": ["vanilla", "reformer"]}) == ["model"]
    keys.append((("model", "reformer"), ("attention", "full"), ("stack", "reversible")))
    assert _naming_facets(keys, varying, groups, {"model": ["vanilla", "reformer"]}) == varying
    assert _naming_facets(keys[:2], varying, groups, {}) == varying  # no sweep declared
