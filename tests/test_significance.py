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


def test_holm_bonferroni_on_a_worked_example():
    """Holm (1979): sorted p, reject while p_(k) <= alpha / (m - k + 1).  m = 4 (None is not
    tested): 0.005 <= 0.0125, 0.01 <= 0.0167, 0.015 <= 0.025, 0.03 <= 0.05 -- all four, where
    Bonferroni's alpha / m = 0.0125 keeps only the first two; 0.04 in place of 0.015 stops the
    step-down at the third (0.03 > 0.025) so 0.04 is not rejected either."""
    from xformer_bench.results.significance import holm_bonferroni

    assert holm_bonferroni([0.01, 0.015, 0.03, None, 0.005]) == [True, True, True, False, True]
    assert holm_bonferroni([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert holm_bonferroni([0.2, None]) == [False, False] and holm_bonferroni([]) == []


def _rows(baseline, others):
    from xformer_bench.results.table import Cell, Row

    return [Row(label, (), (Cell(mean, std, n),), n, n, f"finished={n}")
            for label, (mean, std, n) in [("Base", baseline), *others]]


def test_twenty_rows_each_at_p_003_are_not_marked_after_the_correction():
    """One row in twenty passes p < 0.05 by chance: uncorrected, all twenty would be marked."""
    from xformer_bench.results.aggregate import mark_significant
    from xformer_bench.results.table import Column

    column = Column("test_bpb", "Test bpb", higher_is_better=False)
    p_single = welch_p_value(1.0, 0.1, 10, 1.1, 0.1, 10)
    assert 0.03 < p_single < 0.05
    rows = mark_significant([column], _rows((1.1, 0.1, 10), [(f"R{i}", (1.0, 0.1, 10))
                                                           for i in range(20)]), baseline=0)
    assert not any(row.cells[0].marked for row in rows)
    assert all(row.cells[0].p_value == pytest.approx(p_single) for row in rows[1:])
    alone = mark_significant([column], _rows((1.1, 0.1, 10), [("R", (1.0, 0.1, 10))]), 0)
    assert alone[1].cells[0].marked  # one comparison: Holm is the plain test


def test_a_difference_below_the_noise_floor_is_neither_marked_nor_bold():
    from xformer_bench.results.aggregate import mark_best, mark_significant
    from xformer_bench.results.table import Column, Table

    column = Column("test_bpb", "Test bpb", higher_is_better=False)
    rows = mark_best([column], _rows((1.0, 0.1, 30), [("Tight", (0.95, 0.001, 30))]))
    assert rows[1].cells[0].bold  # the best value ...
    assert welch_p_value(0.95, 0.001, 30, 1.0, 0.1, 30) < 0.05  # ... and "significant"
    marked = mark_significant([column], rows, baseline=0)
    assert not marked[1].cells[0].marked and not marked[1].cells[0].bold  # 0.05 < std 0.1
    table = Table("x", (column,), tuple(marked), "Text", baseline="Base",
                  noise_floor=(("Test bpb", 0.1),), comparisons=1)
    text = markdown.render(table)
    assert "Holm-Bonferroni corrected over the 1 rows compared" in text
    assert "noise floor: Test bpb 0.1)" in text
    one_seed = Table("x", (column,), tuple(marked), "Text", baseline="Base", comparisons=1)
    assert "noise floor: not measured, fewer than two baseline seeds)" in markdown.render(one_seed)


def test_the_csv_keeps_each_metrics_uncorrected_p_value():
    import csv as csv_module
    import io

    from xformer_bench.results import csv_table

    variants = group_variants(collect(FIXTURES).of("fixture_activations"))
    table = build_table("fixture_activations", variants, {"activation": "relu"})
    rows = list(csv_module.DictReader(io.StringIO(csv_table.render(table))))
    metrics = [c for c in table.columns if c.higher_is_better is not None and c.kind != "si"]
    assert metrics
    for j, column in enumerate(table.columns):
        if column not in metrics:
            continue
        by_label = {r["variant"]: r[f"{column.key}_p"] for r in rows}
        assert by_label["ReLU"] == ""  # the baseline is not tested against itself
        gelu = next(row.cells[j] for row in table.rows if row.label == "GeLU")
        if gelu.p_value is not None:
            assert float(by_label["GeLU"]) == pytest.approx(gelu.p_value)
