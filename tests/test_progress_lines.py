"""Without a progress bar (a log, a batch job) each validation prints one line: how far the run
is, its validation metric and the time left; ``trainer.progress_bar=auto`` shows a bar only on a
terminal."""

from __future__ import annotations

import re
import sys

from conftest import run_tiny
from xformer_bench.training.progress_lines import shows_bar

LINE = re.compile(r"\[xbench\] (\S+): step (\d+)/16: val bpb (\d+\.\d{4}) \(\d+m\d\ds(, ~\d+m\d\ds left)?\)")


def test_auto_shows_a_bar_only_on_a_terminal(monkeypatch):
    assert shows_bar(True) and not shows_bar(False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert not shows_bar("auto")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert shows_bar("auto")


def test_a_run_without_a_bar_prints_each_validation_as_the_record_has_it(tmp_path, capsys):
    record = run_tiny(tmp_path)
    lines = [m for m in map(LINE.fullmatch, capsys.readouterr().out.splitlines()) if m]
    assert [int(m[2]) for m in lines] == [p["step"] for p in record["history"]]
    assert [float(m[3]) for m in lines] == [round(p["val/bpb"], 4) for p in record["history"]]
    assert {m[1] for m in lines} == {record["run_id"]}
    assert lines[-1][4] is None and all(m[4] for m in lines[:-1])  # time left, until the end


def test_a_shown_bar_prints_no_lines(tmp_path, capsys):
    run_tiny(tmp_path, "trainer.progress_bar=true")
    assert not any(LINE.fullmatch(line) for line in capsys.readouterr().out.splitlines())
