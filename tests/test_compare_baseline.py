"""scripts/compare_baseline.py: both systems train through xbench's path on the same bytes."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from xformer_bench.config import CONF_DIR

SCRIPT = CONF_DIR.parent / "scripts" / "compare_baseline.py"
TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.d_ff=64",
        "data.seq_len=16", "data.batch_size=4", "data.eval_batch_size=32", "optim.warmup_steps=1"]


def _script():
    spec = importlib.util.spec_from_file_location("compare_baseline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_systems_train_on_the_same_windows_and_are_summarised(tmp_path, monkeypatch, capsys):
    pytest.importorskip("x_transformers")
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(np.random.default_rng(0).integers(97, 123, 6000, dtype=np.uint8).tobytes())
    out = tmp_path / "runs.json"
    monkeypatch.setattr(sys, "argv", ["compare_baseline.py", str(corpus), "--steps", "3", "--seeds",
                                      "0", "1", "--json", str(out), "--", *TINY])
    _script().main()
    runs = json.loads(out.read_text())["runs"]
    assert [(r["system"], r["seed"]) for r in runs] == [
        ("xbench", 0), ("x_transformers", 0), ("xbench", 1), ("x_transformers", 1)]
    for run in runs:  # 3 steps from initialisation: about uniform bytes (8), never below letters
        assert np.log2(26) < run["test_bpb"] < 9.5 and run["params"] > 0
    xbench = [r for r in runs if r["system"] == "xbench"]
    assert xbench[0]["val_bpb"] != xbench[1]["val_bpb"]  # seeds differ
    printed = capsys.readouterr().out
    assert "xbench" in printed and "x_transformers" in printed and " ± " in printed

    monkeypatch.setattr(sys, "argv", ["compare_baseline.py", "--merge", str(out)])
    _script().main()
    assert "seeds 0, 1; merged" in capsys.readouterr().out
