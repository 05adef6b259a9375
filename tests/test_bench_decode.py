"""The decode benchmark: the script writes its table and CSV at tiny sizes,
full attention's key/value cache grows with the tokens decoded, a recurrent state does not --
and a mixer that declares a recurrent state but grows it is caught."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import torch

from conftest import compose_config
from xformer_bench.attention import TokenMixer
from xformer_bench.bench.decode_cost import DecodeShape, decode_points, state_growth
from xformer_bench.models.build import build_model

CPU = torch.device("cpu")
SHAPE = DecodeShape(d_model=16, n_heads=2, n_layers=2, timed=4)


def run_script(*args: str) -> int:
    """``scripts/bench_decode.py ARGS``, in this process (no second interpreter to start)."""
    path = Path(__file__).parent.parent / "scripts" / "bench_decode.py"
    spec = importlib.util.spec_from_file_location("bench_decode", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script.main(list(args))


def test_the_script_writes_the_table_and_full_attentions_cache_grows(tmp_path, capsys):
    assert run_script("--attention", "linear", "--lengths", "16", "32", "64", "--timed", "4",
                      "--d-model", "16", "--heads", "2", "--layers", "1", "--device", "cpu",
                      "--out", str(tmp_path)) == 0
    assert "wrote" in capsys.readouterr().out
    rows = list(csv.DictReader((tmp_path / "decode.csv").open()))
    assert [(r["attention"], r["length"], r["status"]) for r in rows] == [
        (name, n, "ok") for name in ("full", "linear") for n in ("16", "32", "64")]
    full = [float(r["cache_mb"]) for r in rows if r["attention"] == "full"]
    assert full[0] < full[1] < full[2] and all(float(r["ms_per_token"]) > 0 for r in rows)
    table = (tmp_path / "decode.md").read_text()
    assert "| ms/token L=16 |" in table.replace("Variant | ", "") and "| linear |" in table
    assert run_script("--lengths", "16", "18", "--timed", "4", "--out", str(tmp_path)) == 2
    assert "leaves no room for 4 timed steps" in capsys.readouterr().err


class Decay(TokenMixer):
    """A planted recurrent mixer, h_t = h_{t-1} / 2 + x_t: a (B, D) state kept in its cache slot
    (``grow``: it appends each step's input to the state instead -- the violation)."""

    provides = frozenset({"causal", "longer_keys", "variable_length"})
    decode_state = "recurrent"

    def __init__(self, grow: bool = False):
        super().__init__()
        self.grow = grow

    def forward(self, x, ctx):  # (B, T, D)
        slot = ctx.cache.slot() if ctx.cache is not None else {}
        h = slot.get("state", torch.zeros_like(x[:, 0]))
        if self.grow:
            h = h if h.dim() == 3 else h[:, None]
            slot["state"] = torch.cat([h, x], dim=1)  # (B, S, D): grows
            return x
        outputs = []
        for t in range(x.shape[1]):
            h = h / 2 + x[:, t]
            outputs.append(h)
        slot["state"] = h
        return torch.stack(outputs, dim=1)


def planted_lm(grow: bool):
    torch.manual_seed(0)
    model = build_model(compose_config("model.d_model=16", "model.n_heads=2", "model.n_layers=2",
                                       "model.d_ff=32", "data.seq_len=80"), 256)
    for block in model.stack.blocks:
        block.attention = Decay(grow)
    return model.eval()


def test_a_recurrent_state_stays_flat_and_a_growing_one_is_caught():
    flat = decode_points(planted_lm(grow=False), "decay", [16, 64], SHAPE, CPU)
    grown = decode_points(planted_lm(grow=True), "grower", [16, 64], SHAPE, CPU)
    assert [p.status for p in flat + grown] == ["ok"] * 4
    assert {p.decode_state for p in flat + grown} == {"recurrent"}
    assert flat[0].cache_mb == flat[1].cache_mb == 2 * 16 * 4 / 2 ** 20  # two (1, 16) states
    assert grown[1].cache_mb > grown[0].cache_mb
    assert state_growth(flat) == []
    problem, = state_growth(flat + grown)
    assert problem.startswith("attention=grower declares a recurrent decode state, but its cache")


def test_a_model_the_cache_cannot_serve_is_not_applicable():
    model = planted_lm(grow=False)
    model.stack.blocks[1].attention.decode_state = "none"
    points = decode_points(model, "mixed", [16, 32], SHAPE, CPU)
    assert [p.status for p in points] == ["n/a (no cache: token mixer Decay has no cacheable "
                                          "keys or state)"] * 2
    assert points[0].decode_state == "recurrent+none"
