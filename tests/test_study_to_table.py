"""A declared study, run through the CLI, then `make table`'s command: LaTeX, Markdown, plots."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import xbench


def test_a_study_becomes_a_compiling_latex_table_with_plots(tmp_path):
    result = xbench("-m", "experiment=smoke", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(list((tmp_path / "results" / "smoke").glob("*.json"))) == 4

    table = subprocess.run([sys.executable, "-m", "xformer_bench.results", "--results-dir",
                            "results", "--out", "results/tables"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr[-2000:]
    out = tmp_path / "results" / "tables"
    markdown = (out / "smoke.md").read_text()
    rows = [line for line in markdown.splitlines() if line.startswith("| ReLU") or
            line.startswith("| GeLU")]
    assert len(rows) == 2 and all(row.rstrip().endswith("| 2 |") for row in rows)
    assert [p.suffix for p in sorted(out.glob("smoke*.p*"))].count(".png") >= 1
    assert all(p.stat().st_size > 0 for p in out.iterdir())
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed: the table was written but not compiled")
    document = tmp_path / "doc.tex"
    document.write_text("\\documentclass{article}\\usepackage{booktabs}\\begin{document}"
                        f"\\input{{{out / 'smoke.tex'}}}\\end{{document}}\n")
    compiled = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error",
                               document.name], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
    assert compiled.returncode == 0, compiled.stdout[-2000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 0
