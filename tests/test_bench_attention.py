"""The attention cost benchmark: peak memory measured exactly, caps stop a variant and say so,
and the LRA-shaped table renders (its LaTeX compiles)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import compile_latex
from xformer_bench.bench import attention_cost
from xformer_bench.bench.attention_cost import (
    Caps, Measurement, Shape, from_csv, sweep, table, to_csv)
from xformer_bench.bench.peak_memory import PeakLiveBytes, peak_bytes
from xformer_bench.results import latex, markdown

CPU = torch.device("cpu")


def test_peak_live_bytes_counts_each_storage_once_and_releases_it():
    x = torch.randn(256, 256)  # allocated outside: not counted

    def work():
        y = x @ x  # 256 KiB
        z = y.t()  # a view: nothing new
        w = z + 1  # 256 KiB more: 512 KiB live
        del y, z
        w.mul_(2)  # in place: nothing new
        return (w * 2).sum()  # 256 KiB while w lives: 512 KiB again, plus the 4-byte sum

    assert peak_bytes(work, CPU) == 2 * 256 * 256 * 4 + 4
    with PeakLiveBytes() as tracker:
        work()
    assert tracker.live == 0  # everything made inside was released


def test_sweep_stops_a_variant_past_the_caps_and_marks_it():
    shape = Shape(batch=1, heads=2, head_dim=8)
    results = sweep(["full"], [32, 64, 1024], shape, Caps(seconds=30, megabytes=0.2), CPU,
                    repeats=1, progress=lambda line: None)
    assert [m.status for m in results] == ["ok", "ok", "cap"]
    assert results[0].seconds > 0 and 0 < results[0].peak_mb < results[1].peak_mb
    assert to_csv(results).splitlines()[0] == "attention,length,seconds,steps_per_sec,peak_mb,status"


def test_a_failing_option_is_recorded_and_the_sweep_goes_on(monkeypatch):
    """A kernel that fails on the device (or runs out of memory) is a status, not a crash, and
    every measurement reaches ``on_result`` as it is made (the partial CSV of a cut-off sweep)."""
    measure = attention_cost.measure

    def failing(name, length, *args, **kwargs):
        if name == "local" and length == 64:
            raise RuntimeError("planted: no kernel for this dtype\nmore")
        if name == "local" and length == 128:
            raise torch.OutOfMemoryError("planted")
        return measure(name, length, *args, **kwargs)

    monkeypatch.setattr(attention_cost, "measure", failing)
    seen = []
    results = sweep(["full", "local"], [32, 64], Shape(1, 2, 8, dtype="bf16"), Caps(), CPU,
                    repeats=1, progress=lambda line: None, on_result=seen.append)
    assert [(m.attention, m.status) for m in results] == [
        ("full", "ok"), ("full", "ok"), ("local", "ok"),
        ("local", "error (planted: no kernel for this dtype)")]
    assert seen == results and from_csv(to_csv(results)) == results
    oom = sweep(["local"], [128], Shape(1, 2, 8), Caps(), CPU, repeats=1,
                progress=lambda line: None)
    assert oom[0].status == "out of memory"


def test_the_table_has_speed_ups_and_memory_ratios_against_full(tmp_path):
    results = [Measurement("full", 512, 0.02, 10.0), Measurement("full", 1024, 0.08, 40.0),
               Measurement("local", 512, 0.01, 5.0), Measurement("local", 1024, 0.02, 10.0),
               Measurement("fnet", 512, status="n/a (causal)")]
    rendered = table(results, Shape(), "CPU")
    md = markdown.render(rendered)
    assert "| local | 100.00 (2.00x) | 50.00 (4.00x) | 5.0 (0.50x) | 10.0 (0.25x) |" in md
    assert "| fnet | n/a (causal) | — | n/a (causal) | — |" in md
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed")
    (tmp_path / "attention.tex").write_text(latex.render(rendered))
    done = compile_latex(tmp_path, ["attention.tex"])
    assert done.returncode == 0, done.stdout[-2000:]


def test_kernel_scope_leaves_the_projections_out():
    quiet = dict(repeats=1, progress=lambda line: None)
    layer, = sweep(["full"], [64], Shape(1, 2, 8, scope="layer"), Caps(), CPU, **quiet)
    kernel, = sweep(["full"], [64], Shape(1, 2, 8, scope="kernel"), Caps(), CPU, **quiet)
    assert layer.status == kernel.status == "ok"
    assert kernel.peak_mb < layer.peak_mb  # no (B, T, 3D) projection output, no D x D gradients


def test_the_script_benches_bidirectional_only_options_under_their_own_name(tmp_path):
    script = Path(__file__).parent.parent / "scripts" / "bench_attention.py"
    done = subprocess.run(
        [sys.executable, str(script), "--attention", "full", "linformer", "--lengths", "64", "128",
         "--heads", "2", "--head-dim", "8", "--repeats", "1", "--bidirectional",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rendered = (tmp_path / "attention_bidirectional.md").read_text()
    linformer = next(line for line in rendered.splitlines() if line.startswith("| linformer"))
    assert "n/a" not in linformer and "x)" in linformer  # measured, with its ratio to full
    assert not (tmp_path / "attention.md").exists()  # the causal table is not overwritten


def test_the_step_bound_removes_every_attention_kernel_and_scores_the_share_saved():
    from xformer_bench.bench import step_bound

    shape = step_bound.StepShape(d_model=16, n_layers=2, n_heads=2)
    free = step_bound.build("full", 32, shape, free=True)
    kernels = [m.kernel for m in free.modules() if hasattr(m, "kernel")]
    assert len(kernels) == 2 and all(isinstance(k, step_bound.FreeKernel) for k in kernels)
    with pytest.raises(RuntimeError, match="replaced 0 attention kernels"):
        step_bound.build("gmlp", 32, shape, free=True)  # no kernel to replace: said, not faked
    full, option, bound = (step_bound.StepPoint(n, 32, s, 1.0)
                           for n, s in (("full", 1.0), ("local", 0.7), ("free", 0.6)))
    assert step_bound.share_of_bound(full, option, bound) == pytest.approx(0.75)
    points = step_bound.sweep(["full", "local"], [32], shape, steps=1, progress=lambda _: None)
    assert [p.attention for p in points] == ["full", "free", "local"]
    table = step_bound.markdown(points, "test")
    assert "| local | 32 |" in table and "| full (free) | 32 |" in table
    assert points[0].attended == 1.0 and points[1].attended is None


def test_the_step_bound_ceiling_is_one_minus_the_attended_pairs():
    """local with a 16-key window at T = 64 attends query i's min(i + 1, 16) keys: 904 of the
    2,080 causal pairs; the row's ceiling is the rest."""
    from xformer_bench.bench import step_bound

    shape = step_bound.StepShape(d_model=16, n_layers=1, n_heads=2)
    model = step_bound.build("local", 64, shape, overrides=("attention.window=16",))
    attended = step_bound.attended_fraction(model, 64)  # from local's declared pattern
    assert attended == pytest.approx(sum(min(i + 1, 16) for i in range(64)) / (64 * 65 / 2))
    from xformer_bench.models.attended_pairs import attention_coverage, first_token_mixer

    probed = attention_coverage(first_token_mixer(model), 64, [0], causal=True)
    assert probed["attended_fraction"] == pytest.approx(attended)  # what the kernel computes
    points = [step_bound.StepPoint("full", 64, 1.0, 1.0, 1.0),
              step_bound.StepPoint("free", 64, 0.4, 1.0),
              step_bound.StepPoint("local", 64, 0.5, 1.0, attended)]
    row = next(line for line in step_bound.markdown(points, "t").splitlines()
               if line.startswith("| local"))
    assert "| 43 % | 83 % (57 %) |" in row  # 904 / 2080 attended; (1 - 0.5) / (1 - 0.4) saved
