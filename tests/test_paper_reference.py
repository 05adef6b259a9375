"""The paper beside the measurement: the shipped published tables (xformer_bench.references),
the rank statistics against hand-worked cases, and a fixture activations study declaring
``reference: narang2021_table1`` rendered in Markdown, CSV and LaTeX; the shipped-reference
regression guard."""

from __future__ import annotations

import csv
import io
import json
import shutil

import pytest

from conftest import compile_latex
from xformer_bench import references
from xformer_bench.config import compose_config
from xformer_bench.results import csv_table, latex, layout, markdown, paper, report
from xformer_bench.results.aggregate import build_table
from xformer_bench.results.collect import collect
from xformer_bench.results.paper_columns import Comparison, paper_row
from xformer_bench.results.record import IDENTITY_EXCLUDED, REQUIRED_KEYS
from xformer_bench.results.regression import EXPECTED_FILE
from xformer_bench.results.variants import group_variants

# --- the shipped tables ----------------------------------------------------------------------


def test_every_shipped_table_loads_with_its_citation():
    assert references.names() == ["lra2021_table1", "narang2021_table1",
                                  "sparse_transformer2019_table1", "sparse_transformer2019_table2",
                                  "transformer_xl2019_table2", "vit2021_table1"]
    for name in references.names():
        table = references.load(name)
        assert table.citation and table.short and table.rows
        assert table.baseline is None or table.row(table.baseline)
        for measured, column in table.measures.items():
            assert column in table.rows[0].cells, (name, measured)


def test_narangs_table_1_is_copied_whole():
    table = references.load("narang2021_table1")
    assert len(table.rows) == 52 and table.baseline == "Vanilla Transformer"
    assert table.row("GeLU").overrides == ("activation=gelu",)
    assert table.row("GeLU").value("final_loss") == 1.838
    assert table.row("SwiGLU").value("early_loss_std") == 0.003
    assert table.row("Vanilla Transformer").value("params") is None  # "223M": text, not a number
    assert table.row("Adaptive softmax").overrides == ("modification=adaptive_softmax",)
    assert set(table.missing()) == {"Synthesizer (dense plus)", "Synthesizer (random plus)"}
    with pytest.raises(KeyError, match="narang2021_table1"):
        references.load("narang2021")


KEYED = [(name, row.label, row.overrides) for name in references.names()
         for row in references.load(name).keyed()]


def test_every_keyed_configuration_composes():
    failures = []
    for name, label, overrides in KEYED:
        try:
            compose_config(*overrides)
        except Exception as error:  # noqa: BLE001 -- every failing row named at once
            failures.append(f"{name}: {label}: {type(error).__name__}: {error}")
    assert not failures, "\n".join(failures)


def test_the_reference_declaration_does_not_change_a_runs_identity():
    assert "reference" in IDENTITY_EXCLUDED
    assert compose_config("experiment=narang_activations")["reference"] == "narang2021_table1"


# --- the statistics --------------------------------------------------------------------------


def test_spearman_and_kendall_by_hand():
    # d = (-1, 1, -1, 1, 0): rho = 1 - 6 * 4 / (5 * 24) = 0.8; 8 concordant, 2 discordant of 10
    x, y = [1, 2, 3, 4, 5], [2, 1, 4, 3, 5]
    assert paper.spearman_rho(x, y) == pytest.approx(0.8)
    assert paper.kendall_tau_b(x, y) == pytest.approx(0.6)
    # a tie: x's average ranks (1, 2.5, 2.5, 4): rho = 4.5 / sqrt(4.5 * 5); tau-b = 5 / sqrt(5 * 6)
    x, y = [1, 2, 2, 3], [1, 2, 3, 4]
    assert list(paper.average_ranks(x)) == [1, 2.5, 2.5, 4]
    assert paper.spearman_rho(x, y) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)
    assert paper.kendall_tau_b(x, y) == pytest.approx(5 / 30 ** 0.5)
    assert paper.spearman_rho([1, 1, 1], [1, 2, 3]) != paper.spearman_rho([1, 1, 1], [1, 2, 3])


def test_against_scipy_where_present():
    stats = pytest.importorskip("scipy.stats")
    x, y = [3.1, 2.0, 2.0, 5.5, 4.0, 1.0, 4.0], [2.2, 1.0, 3.0, 5.0, 5.0, 0.5, 4.5]
    assert paper.spearman_rho(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
    assert paper.kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y)[0])


def test_the_bootstrap_interval_is_deterministic_and_holds_the_estimate():
    seeds = [[1.0, 1.1, 0.9], [2.0, 2.3, 1.8], [2.9, 3.2, 3.1], [3.0, 4.2, 3.9], [5.0, 5.1, 4.9]]
    published = [1.0, 2.5, 2.0, 4.0, 5.0]
    first = paper.bootstrap(paper.spearman_rho, seeds, published)
    assert first == paper.bootstrap(paper.spearman_rho, seeds, published)
    assert first.low <= first.value <= first.high
    tau = paper.bootstrap(paper.kendall_tau_b, seeds, published)
    assert tau.low <= tau.value <= tau.high and tau.value == pytest.approx(0.8)


# --- a fixture study -------------------------------------------------------------------------

STUDY = "paper_fixture"
FINAL = {"relu": 2.170, "gelu": 2.150, "swiglu": 2.120, "sigmoid": 2.470, "elu": 2.230,
         "squared_relu": 2.140}  # measured final loss; Squared ReLU has no row in the paper
SPEED = {"relu": 9.0, "gelu": 9.3, "swiglu": 7.5, "sigmoid": 8.0, "elu": 9.05, "squared_relu": 9.1}


def record(activation, seed, shift=0.0):
    choices = {"model": "vanilla", "attention": "full", "norm": "layernorm",
               "activation": activation, "position": "sinusoidal", "stack": "standard",
               "data": "text", "trainer": "default", "logger": "csv"}
    config = {g: {"name": c, "label": c} for g, c in choices.items()}
    config["activation"]["label"] = {"relu": "ReLU", "gelu": "GeLU", "swiglu": "SwiGLU",
                                     "sigmoid": "Sigmoid", "elu": "ELU",
                                     "squared_relu": "Squared ReLU"}[activation]
    config.update(seed=seed, experiment_name=STUDY, paths={"results_dir": "results"},
                  sweep={"activation": list(FINAL), "seed": [0, 1, 2]})
    config["trainer"]["max_steps"] = 300
    jitter = 0.004 * (seed - 1) + shift
    rec = dict.fromkeys(REQUIRED_KEYS)
    rec.update(schema=2, run_id=f"{activation}_s{seed}", experiment=STUDY, status="finished",
               choices=choices, overrides=[f"activation={activation}", f"seed={seed}"],
               seed=seed, params=826_000, flops_per_step=1e9,
               steps_per_sec=SPEED[activation] + 0.1 * (seed - 1),
               early={"val/loss": FINAL[activation] + 0.4 + jitter},
               final={"val/loss": FINAL[activation] + jitter,
                      "val/bpb": 1.44 * (FINAL[activation] + jitter)},
               test={"test/bpb": 1.44 * (FINAL[activation] + jitter)}, task="lm",
               metrics=[{"name": "bpb", "title": "bpb", "higher_is_better": False, "digits": 3}],
               primary_metric="bpb", eval_unit="bytes", eval_counts={}, steps=300, config=config)
    return rec


def write_study(folder, monkeypatch, shift=0.0):
    records = folder / STUDY
    records.mkdir(parents=True, exist_ok=True)
    for activation in FINAL:
        for seed in (0, 1, 2):
            (records / f"{activation}_s{seed}.json").write_text(
                json.dumps(record(activation, seed, shift if activation == "relu" else 0.0)))
    study = folder.parent / f"{STUDY}.yaml"
    study.write_text("baseline: {activation: relu}\nreference: narang2021_table1\n")
    monkeypatch.setattr(report, "study_path", lambda experiment: study)
    return folder


def fixture_table(tmp_path, monkeypatch):
    results = write_study(tmp_path / "results", monkeypatch)
    variants = group_variants(collect(results).of(STUDY))
    return build_table(STUDY, variants, report.study_baseline(STUDY), (),
                       report.study_reference(STUDY))


def test_rows_map_to_the_papers_rows_the_baseline_to_its_baseline():
    comparison = Comparison(references.load("narang2021_table1"), {"activation": "relu"})
    assert paper_row([record("relu", 0)], comparison).label == "Vanilla Transformer"
    assert paper_row([record("swiglu", 0)], comparison).label == "SwiGLU"
    assert paper_row([record("squared_relu", 0)], comparison) is None
    norms = Comparison(comparison.table, {"norm": "layernorm"})  # relu is not the baseline here
    rms = record("relu", 0)
    rms["choices"]["norm"] = "rmsnorm"
    assert paper_row([rms], norms).label == "RMS Norm"


def test_the_paper_column_sits_beside_each_mapped_measure(tmp_path, monkeypatch):
    table = fixture_table(tmp_path, monkeypatch)
    titles = [c.title for c in table.columns]
    assert titles == ["Params", "Ops", "Step/s", "Paper", "Early loss", "Paper", "Final loss",
                      "Paper", "text bpb", "Paper", "Seeds"]
    rows = {row.label: dict(zip((c.key for c in table.columns), row.cells)) for row in table.rows}
    assert rows["SwiGLU"]["final_loss_paper"].mean == 1.789
    assert rows["SwiGLU"]["early_loss_paper"].std == 0.003
    assert rows["SwiGLU"]["steps_per_sec_paper"].mean == pytest.approx(3.53 / 3.50)
    assert rows["Squared ReLU"]["final_loss_paper"].missing
    # the sign of the change against the baseline on both sides
    assert rows["SwiGLU"]["final_loss_paper"].agreement == "agrees"      # both lower
    assert rows["ELU"]["final_loss_paper"].agreement == "agrees"         # both higher
    assert rows["GeLU"]["final_loss_paper"].agreement == "disagrees"     # paper flat at 1.838
    assert rows["GeLU"]["steps_per_sec_paper"].agreement == "agrees"     # both faster
    assert rows["SwiGLU"]["steps_per_sec_paper"].agreement == "disagrees"  # paper 3.53 > 3.50
    assert rows["ReLU"]["final_loss_paper"].agreement == ""              # the baseline itself


def test_within_noise_is_the_measured_baselines_seed_std(tmp_path, monkeypatch):
    table = fixture_table(tmp_path, monkeypatch)
    keys = [c.key for c in table.columns]
    relu, elu = (next(r for r in table.rows if r.label == label) for label in ("ReLU", "ELU"))
    assert relu.cells[keys.index("steps_per_sec")].std == pytest.approx(0.1)
    assert elu.cells[keys.index("steps_per_sec_paper")].agreement == "within noise"  # +0.05


def test_md_csv_and_latex_carry_the_paper_its_agreement_and_the_summary(tmp_path, monkeypatch):
    table = fixture_table(tmp_path, monkeypatch)
    md = markdown.render(layout.with_tests(table, paper=report.study_reference(STUDY)))
    header = [h.strip() for h in md.splitlines()[2].split("|")[1:-1]]
    assert len(header) == len(set(header))  # one header per quantity
    assert "Paper final loss (nats/token)" in header and "Agrees (final loss)" in header
    swiglu = next(line for line in md.splitlines() if line.startswith("| SwiGLU |"))
    assert "| 1.789 | yes |" in swiglu and "1.789 agrees" not in md  # value, verdict apart
    assert "Narang" in md and "Sharan Narang" in md
    summary = next(line for line in md.splitlines() if line.startswith("Final loss against"))
    assert "(5 rows; 3 agrees, 1 disagrees, 0 within noise)" in summary
    # measured ranks (ReLU, GeLU, SwiGLU, Sigmoid, ELU) 3 2 1 5 4, the paper's 2.5 2.5 1 4 5:
    # rho = 8.5 / sqrt(10 * 9.5); tau-b = (8 - 1) / sqrt(10 * 9); seeds never reorder them
    assert "Spearman's rho 0.87 [0.87, 0.87]" in summary
    assert "Kendall's tau-b 0.74 [0.74, 0.74]" in summary
    text = csv_table.render(table)
    rows = list(csv.DictReader(io.StringIO(text.split("\n#")[0])))
    swiglu = next(r for r in rows if r["variant"] == "SwiGLU")
    assert swiglu["final_loss_paper"] == "1.789"
    assert swiglu["final_loss_paper_agreement"] == "agrees"
    assert any(line.startswith("# Final loss against the paper") for line in text.splitlines())
    tex = latex.render(table)
    assert "1.789 agrees" in tex and "Spearman's rho" in tex
    if shutil.which("pdflatex"):
        (tmp_path / "t.tex").write_text(tex)
        result = compile_latex(tmp_path, ["t"])
        assert result.returncode == 0, result.stdout[-2000:]


def test_a_study_without_a_reference_has_no_paper_column(tmp_path, monkeypatch):
    results = write_study(tmp_path / "results", monkeypatch)
    table = build_table(STUDY, group_variants(collect(results).of(STUDY)), {"activation": "relu"})
    assert "Paper" not in [c.title for c in table.columns] and not table.summary


# --- the regression guard --------------------------------------------------------------------

def test_the_guard_records_then_warns_on_a_shifted_baseline_only(tmp_path, monkeypatch):
    reference = tmp_path / "reference" / "fixture_ref"
    records = write_study(reference / "records", monkeypatch)
    lines = []
    written = report.make_tables(records, reference, plots=False, log=lines.append)
    expected = json.loads((reference / EXPECTED_FILE).read_text())
    assert reference / EXPECTED_FILE in written and not lines
    assert expected[STUDY]["baseline"] == "ReLU"
    assert expected[STUDY]["metrics"]["final_loss"]["mean"] == pytest.approx(2.170)
    report.make_tables(records, reference, plots=False, log=lines.append)  # unchanged: quiet
    assert not [line for line in lines if "moved" in line]
    write_study(records, monkeypatch, shift=0.05)  # a code change moved the baseline row
    report.make_tables(records, reference, plots=False, log=lines.append)
    moved = [line for line in lines if line.startswith("warning:") and "moved" in line]
    assert moved and all("ReLU" in line for line in moved)
    assert any("Final loss" in line for line in moved)
    # a results folder of one's own runs keeps no expected numbers
    own = write_study(tmp_path / "results", monkeypatch)
    report.make_tables(own, tmp_path / "tables", plots=False, log=lines.append)
    assert not (tmp_path / EXPECTED_FILE).exists() and not (own / EXPECTED_FILE).exists()
