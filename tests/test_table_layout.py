"""The LaTeX table laid out for a paper page (results/layout.py): declared and overridden
column sets, constant columns dropped, Δ and Holm p columns, the paper's value and its verdict
apart, and every shipped study's table compiling without an Overfull hbox in a one-column
article."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from xformer_bench.results import latex, layout
from xformer_bench.results.__main__ import main
from xformer_bench.results.significance import holm_bonferroni
from xformer_bench.results.table import Cell, Column, Row, Table

REFERENCE = Path(__file__).parent.parent / "results" / "reference"
SHIPPED = sorted(p / "records" for p in REFERENCE.iterdir()
                 if (p / "records").is_dir() and not (p / "INCOMPLETE").exists())
FAST = REFERENCE / "narang_activations_300_steps_tinyshakespeare" / "records"
OVERFULL = re.compile(r"Overfull \\hbox \(([0-9.]+)pt too wide\)")


def _row(label, bpb, p=None, attended=100.0, paper=None, agreement=""):
    return Row(label, (("x", label),), (
        Cell(mean=826e3, n=1), Cell(mean=attended, n=1), Cell(mean=bpb, std=0.01, n=3, p_value=p),
        Cell(mean=paper, n=1, agreement=agreement) if paper else Cell(),
        Cell(text="3")), 3, 3, "finished=3")


TABLE = Table("toy", (Column("params", "Params", kind="si"),
                      Column("attended", "Attended %", digits=1),
                      Column("text_bpb", "text bpb", higher_is_better=False),
                      Column("text_bpb_paper", "Paper", kind="paper"),
                      Column("seeds", "Seeds", kind="text")),
              (_row("ReLU", 3.0, paper=1.838), _row("GeLU", 3.1, 0.01, 90.0, 1.9, "agrees"),
               _row("ELU", 2.9, 0.04, paper=1.8, agreement="within noise")),
              loss_data="Text", baseline="ReLU", comparisons=2)


def titles(table):
    return [c.title for c in table.columns]


def test_the_default_set_drops_constant_columns_and_names_them_once():
    out = layout.layout(TABLE)
    assert titles(out) == ["bpb", "Δ bpb", "p", "Paper value", "Agrees"]
    assert "Same in every row: Params 826K, Seeds 3." in out.legend
    assert "Agrees:" in out.legend and "Δ bpb:" in out.legend


def test_a_declared_set_is_honoured_in_its_order():
    out = layout.layout(TABLE, ["attended", "bpb", "p"])
    assert titles(out) == ["Attended %", "bpb", "p"]  # not constant here: 100, 90, 100
    with pytest.raises(Exception, match="nope"):
        layout.layout(TABLE, ["nope"])


def test_delta_is_row_minus_baseline_and_p_is_holm_adjusted():
    out = layout.layout(TABLE, ["metric", "delta", "p", "text_bpb_agrees"])
    cells = {row.label: dict(zip(titles(out), row.cells)) for row in out.rows}
    assert cells["ReLU"]["Δ bpb"].missing and cells["ReLU"]["p"].missing
    assert cells["GeLU"]["Δ bpb"].mean == pytest.approx(0.1)
    assert cells["ELU"]["Δ bpb"].mean == pytest.approx(-0.1)
    assert (cells["GeLU"]["p"].text, cells["ELU"]["p"].text) == ("0.02", "0.04")  # 2 x 0.01; max(0.02, 0.04)
    assert (cells["GeLU"]["Agrees"].text, cells["ELU"]["Agrees"].text) == ("yes", "≈")


@pytest.mark.parametrize("ps", [[0.01, 0.04, 0.03], [0.001, None, 0.2, 0.02], [0.5, 0.01]])
def test_holm_adjusted_p_below_alpha_exactly_where_holm_rejects(ps):
    adjusted = layout.holm_adjusted(ps)
    assert [a is not None and a <= 0.05 for a in adjusted] == holm_bonferroni(ps)


def test_the_latex_has_a_short_caption_the_full_one_below_and_a_table_star_option():
    tex = latex.render(layout.layout(TABLE), "table*")
    caption = re.search(r"\\caption\{(.*)\}", tex).group(1)
    assert len(caption.split()) < 120 and tex.startswith("%") and r"\begin{table*}" in tex
    assert r"{\footnotesize toy: mean" in tex  # the full caption, under the tabular
    with pytest.raises(ValueError):
        latex.render(TABLE, "figure")


def _compile(tex: Path, folder: Path) -> list[float]:
    """The Overfull hbox widths of ``tex`` in a one-column article (pdflatex must succeed)."""
    (folder / "doc.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs}\n"
                                    f"\\begin{{document}}\n\\input{{{tex}}}\n\\end{{document}}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
                          cwd=folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    return [float(w) for w in OVERFULL.findall((folder / "doc.log").read_text(errors="replace"))]


def _rendered(records: Path, out: Path, *options: str) -> list[Path]:
    assert main(["--results-dir", str(records), "--out", str(out), "--no-plots", *options]) == 0
    return sorted(out.glob("*.tex"))


def _needs_pdflatex():
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (.ci/run installs it): the LaTeX is not compiled")


def test_one_shipped_study_fits_a_one_column_page(tmp_path):
    _needs_pdflatex()
    for tex in _rendered(FAST, tmp_path):
        assert _compile(tex, tmp_path) == [], tex.name
    md = (tmp_path / "narang_activations.md").read_text()
    assert "Δ bpb" in md.splitlines()[2] and "| p |" in md.splitlines()[2]  # full + Δ, p


def test_columns_override_the_studys_declaration(tmp_path):
    tex = _rendered(FAST, tmp_path, "--columns", "final_loss,ops")[0].read_text()
    header = next(line for line in tex.splitlines() if line.startswith("Variant"))
    assert header == r"Variant & Final loss \\"  # Ops 11.7G in every row: dropped
    assert "Same in every row: Ops 11.7G." in tex


def test_a_named_set_stands_for_its_columns(tmp_path):
    tex = _rendered(FAST, tmp_path, "--columns", "losses")[0].read_text()
    header = next(line for line in tex.splitlines() if line.startswith("Variant"))
    assert header == r"Variant & Early loss & Final loss & bpb & $\Delta$ bpb & p \\"


@pytest.mark.slow
@pytest.mark.parametrize("records", SHIPPED, ids=lambda p: p.parent.name)
def test_every_shipped_study_fits_a_one_column_page(records, tmp_path):
    _needs_pdflatex()
    out = tmp_path / "tables"
    for tex in _rendered(records, out):
        assert _compile(tex, out) == [], f"{records.parent.name}/{tex.name}"
