"""The `xbench` command as a user runs it (subprocess, offline)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import TINY_RUN
from conftest import xbench as _xbench


def test_help_lists_every_group_and_its_options(tmp_path):
    out = _xbench("--help", cwd=tmp_path).stdout
    for line in ("attention: full", "data: enwik8, synthetic, text", "model: vanilla",
                 "logger: csv, none", "trainer: default"):
        assert line.split(":")[0] + ":" in out and line.split(": ")[1].split(",")[0] in out
    assert "model.d_model" in out


@pytest.mark.parametrize("argument", ["--help", "attention=nope"])
def test_help_and_a_bad_override_answer_without_torch(tmp_path, argument):
    """``xbench --help`` and a one-line ``error:`` come before torch and Lightning are imported
    (about 5 s of a 2-core CPU's time): the signal handlers installed first must not pull them
    in."""
    code = (f"import sys; sys.argv = ['xbench', {argument!r}]\n"
            "from xformer_bench.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted({'torch', 'lightning'} & set(sys.modules)), file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.stderr.strip().splitlines()[-1] == "[]", result.stderr[-2000:]


def test_cfg_job_prints_the_composed_config(tmp_path):
    out = _xbench("--cfg", "job", "activation=relu", cwd=tmp_path).stdout
    assert "name: relu" in out and "d_model: 128" in out


def test_a_tiny_run_end_to_end(tmp_path):
    result = _xbench(*TINY_RUN, "experiment_name=smoke", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "final val bpb" in result.stdout and "steps/s" in result.stdout
    [record_path] = (tmp_path / "results" / "smoke").glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "finished"
    assert record["choices"] == {"model": "vanilla", "attention": "full", "norm": "layernorm",
                                 "activation": "gelu", "position": "sinusoidal", "ffn": "dense", "stack": "standard",
                                 "embedding": "lookup", "head": "softmax", "modification": None, "data": "synthetic", "trainer": "default", "logger": "none"}
    assert "trainer.max_steps=16" in record["overrides"]
    assert str(record_path.relative_to(tmp_path)) in result.stdout


def test_unknown_variant_is_a_one_line_error(tmp_path):
    result = _xbench("attention=nope", cwd=tmp_path)
    assert result.returncode != 0
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "attention=nope is not an option of attention; choose one of:" in error
    assert "full" in error


def test_unknown_registered_name_is_one_error_line_before_training(tmp_path):
    result = _xbench(*TINY_RUN, "attention.name=nope", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    from xformer_bench.registry import ATTENTION

    assert errors == [f"error: unknown attention 'nope'; choose one of: {', '.join(ATTENTION.names())}"]
    assert "Traceback" not in result.stderr and not (tmp_path / "results").exists()


def test_missing_enwik8_offline_is_one_line_and_fast(tmp_path):
    started = time.perf_counter()
    result = _xbench("data=enwik8", cwd=tmp_path)
    assert time.perf_counter() - started < 30
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "enwik8.zip" in errors[0] and str(tmp_path / "data") in errors[0]
    assert "Traceback" not in result.stderr


def test_a_run_too_short_to_time_says_so_instead_of_nan():
    from xformer_bench.job import _speed

    assert _speed({"steps_per_sec": float("nan"), "tokens_per_sec": float("nan")}) == \
        "steps/s not timed (the first step is warm-up)"
    assert _speed({"steps_per_sec": 5.6, "tokens_per_sec": 11469.0}) == \
        "5.60 steps/s, 11,469 tokens/s"
