"""Rows that differ from a study's baseline are marked by Welch's t-test over seeds."""

from __future__ import annotations

import pytest

from xformer_bench.results import latex, markdown
from xformer_bench.results.aggregate import build_table
from xformer_bench.results.collect import collect
from xformer_bench.results.report import study_baseline
from xformer_bench.results.significance import regularized_incomplete_beta, welch_p_value
from xformer_bench.results.variants import group_variants

from test_tables import FIXTURES


@pytest.mark.parametrize(("df", "t", "p"), [  # two-sided critical values of Student's t tables
    (1, 12.706, 0.05), (2, 4.303, 0.05), (5, 2.015, 0.10), (10, 2.228, 0.05), (30, 2.750, 0.01),
    (4, 8.610, 0.001)])
def test_two_sided_p_values_match_the_t_table(df, t, p):
    assert regularized_incomplete_beta(df / (df + t * t), df / 2, 0.5) == pytest.approx(p, rel=2e-3)


def test_welch_uses_the_satterthwaite_degrees_of_freedom():
    # equal variances and seeds: df = 2 (n - 1) = 4; t = 0.2 / sqrt(2 * 0.01 / 3) = 2.449
    assert welch_p_value(1.0, 0.1, 3, 1.2, 0.1, 3) == pytest.approx(0.0705, abs=5e-4)
    # unequal: s1 = 1 (n 10), s2 = 3 (n 10) -> df = (0.1 + 0.9)^2 / (0.01/9 + 0.81/9) = 10.98
    t = 2.0 / 1.0
    expected = regularized_incomplete_beta(10.976 / (10.976 + t * t), 10.976 / 2, 0.5)
    assert welch_p_value(0.0, 1.0, 10, 2.0, 3.0, 10) == pytest.approx(expected, rel=1e-3)
    assert welch_p_value(1.0, 0.1, 1, 2.0, 0.1, 3) is None  # one seed: no test


def test_the_table_marks_cells_that_differ_from_the_baseline_row():
    variants = group_variants(collect(FIXTURES).of("fixture_activations"))
    table = build_table("fixture_activations", variants, {"activation": "relu"})
    assert table.baseline == "ReLU"
    by_label = {row.label: row for row in table.rows}
    for j, column in enumerate(table.columns):
        base = by_label["ReLU"].cells[j]
        assert not base.marked
        assert not by_label["SwiGLU"].cells[j].marked  # one seed: never tested
        gelu = by_label["GeLU"].cells[j]
        if column.higher_is_better is None or gelu.mean is None:
            assert not gelu.marked
            continue
        p = welch_p_value(gelu.mean, gelu.std, gelu.n, base.mean, base.std, base.n)
        assert gelu.marked == (p < 0.05), column.title
    assert any(c.marked for c in by_label["GeLU"].cells)
    md, tex = markdown.render(table), latex.render(table)
    assert "†" in md and "differs from the baseline row, ReLU, by Welch's t-test" in md
    assert r"$^\dagger$" in tex and "†" not in tex
    unmarked = build_table("fixture_activations", variants)  # no baseline declared
    assert unmarked.baseline is None and "†" not in markdown.render(unmarked)


def test_the_narang_studies_declare_their_baselines():
    assert study_baseline("narang_activations") == {"activation": "relu"}
    assert study_baseline("narang_norms") == {"norm": "layernorm"}
    assert study_baseline("fixture_activations") is None


def test_a_marked_table_compiles(tmp_path):
    import shutil

    from conftest import compile_latex

    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed")
    variants = group_variants(collect(FIXTURES).of("fixture_activations"))
    (tmp_path / "t.tex").write_text(latex.render(build_table("x", variants, {"activation": "relu"})))
    done = compile_latex(tmp_path, ["t.tex"])
    assert done.returncode == 0, done.stdout[-2000:]


def test_no_variance_on_either_side_is_not_testable_and_the_caption_says_so():
    """Three equal seeds a side prove nothing about the spread: no p-value (not p = 0), no mark,
    and the caption names the cell instead."""
    assert welch_p_value(1.0, 0.0, 3, 2.0, 0.0, 3) is None
    assert welch_p_value(1.0, 0.0, 3, 1.0, 0.0, 3) is None
    assert welch_p_value(1.0, 0.0, 3, 2.0, 0.1, 3) < 0.05  # one side varies: testable
    from xformer_bench.results.aggregate import mark_significant
    from xformer_bench.results.table import Cell, Column, Row, Table

    column = Column("test_bpb", "Test bpb", higher_is_better=False)
    rows = [Row(label, (), (Cell(mean, 0.0, 3),), 3, 3, "finished=3")
            for label, mean in (("Base", 1.0), ("Other", 2.0))]
    marked = mark_significant([column], rows, baseline=0)
    assert not marked[1].cells[0].marked and marked[1].cells[0].untestable
    table = Table("x", (column,), tuple(marked), "Text", baseline="Base")
    assert "Not testable (no variance over seeds in the row or the baseline): Other (Test bpb)" \
        in markdown.render(table)
