"""Hybrid stacks (``model.hybrid``): another token mixer at declared depths,
placed where the layout says, checked like the first, refused in one line where the stack
cannot take it, decoded through the cache as the forward pass scores, and named in the table."""

from __future__ import annotations

import pytest
import torch

from conftest import compose_config, seeded_tokens
from references import decode_step_by_step
from xformer_bench.errors import ConfigError
from xformer_bench.hybrid_layout import hybrid_label, hybrid_layout
from xformer_bench.models.build import build_model
from xformer_bench.models.cached_decoding import cache_blocker
from xformer_bench.results.variants import group_variants, label_of

SMALL = ("model.d_model=32", "model.n_heads=2", "model.d_ff=64", "data.seq_len=24")


def hybrid_lm(*overrides: str, layers: int = 4):
    torch.manual_seed(0)
    return build_model(compose_config(*SMALL, f"model.n_layers={layers}", *overrides), 64)


def kernels(model) -> list[str]:
    return [type(block.attention.kernel).__name__ for block in model.stack.blocks]


def test_every_kth_layer_from_its_offset_or_the_layers_listed():
    full = {"name": "full", "label": "Full attention"}
    assert hybrid_layout({"attention": full, "every": 4}, 12).layers == (3, 7, 11)
    assert hybrid_layout({"attention": full, "every": 3, "offset": 0}, 7).layers == (0, 3, 6)
    assert hybrid_layout({"attention": "local", "layers": [5, 1]}, 6).layers == (1, 5)
    assert hybrid_layout({"attention": "local", "layers": [5]}, 6).attention["window"] == 256
    assert hybrid_layout(None, 4) is None


@pytest.mark.parametrize("spec, message", [
    ({"attention": "full", "layers": [1, 4]}, r"layer 4 is out of range for model.n_layers=4"),
    ({"attention": "nope", "every": 2}, r"model.hybrid.attention='nope' is not an attention"),
    ({"attention": "full", "every": 2, "stride": 1}, r"model.hybrid.stride is not a key"),
    ({"attention": "full", "every": 2, "layers": [1]}, r"exactly one of every"),
    ({"attention": "full", "every": 8}, r"at no layer of model.n_layers=4"),
    ({"attention": "full", "every": 1}, r"every layer attention=full: choose attention=full"),
    ({"attention": "full", "every": 2, "offset": 2}, r"offset=2 must be below"),
    ({"every": 2}, r"names no attention"),
])
def test_a_layout_the_stack_cannot_take_is_one_line(spec, message):
    with pytest.raises(ConfigError, match=message) as error:
        hybrid_layout(spec, 4)
    assert "\n" not in str(error.value)


def test_the_declared_layers_get_the_other_mixer_and_the_run_records_it():
    config = compose_config(*SMALL, "attention=linear", "+model.hybrid={attention:full,every:2}")
    assert config["model"]["hybrid"] == {"attention": "full", "every": 2}  # in the record's config
    model = hybrid_lm("attention=linear", "+model.hybrid={attention:full,every:2}")
    assert kernels(model) == ["LinearAttention", "FullAttention"] * 2
    local = hybrid_lm("attention=linear", "+attention@model.hybrid.attention=local",
                      "model.hybrid.attention.window=5", "+model.hybrid.layers=[0]")
    assert kernels(local) == ["LocalAttention", *["LinearAttention"] * 3]
    assert local.stack.blocks[0].attention.kernel.window == 5
    assert model(seeded_tokens(length=24)).shape == (3, 24, 64)


@pytest.mark.parametrize("overrides, message", [
    (("model.share_blocks=true",), r"model.share_blocks=true shares one block across depth"),
    (("stack=universal",), r"stack=universal shares one block across depth"),
    (("+model.hybrid.attention=fnet",), r"model.hybrid.attention=fnet"),  # bidirectional only
])
def test_a_stack_or_mixer_that_cannot_take_the_hybrid_is_refused(overrides, message):
    hybrid = [o for o in overrides if o.startswith("+model.hybrid.attention")] or \
        ["+model.hybrid.attention=full"]
    rest = [o for o in overrides if not o.startswith("+model.hybrid")]
    with pytest.raises(ConfigError, match=message) as error:
        hybrid_lm("attention=linear", *hybrid, "+model.hybrid.every=2", *rest)
    assert "\n" not in str(error.value)


def test_a_hybrid_decodes_through_the_cache_as_the_forward_pass_scores():
    model = hybrid_lm("attention=linear", "+attention@model.hybrid.attention=local",
                      "model.hybrid.attention.window=5", "+model.hybrid.every=2",
                      layers=2).eval()
    assert cache_blocker(model) is None
    tokens = seeded_tokens(batch=2, length=24)
    with torch.no_grad():
        error = (decode_step_by_step(model, tokens, prefix=3) - model(tokens)).abs().max()
    assert error < 1e-4


def _record(*overrides: str, choices: dict) -> dict:
    config = compose_config(*SMALL, *overrides)
    return {"config": config, "choices": choices, "overrides": list(overrides),
            "seed": 0, "run_id": "-".join(overrides), "status": "finished"}


def test_the_table_names_the_hybrid_by_its_mixers_and_layout():
    plain = _record("attention=linear", choices={"model": "vanilla", "attention": "linear"})
    hybrid = _record("attention=linear", "+model.hybrid={attention:full,every:2}",
                     choices={"model": "vanilla", "attention": "linear"})
    assert hybrid_label(hybrid["config"]) == "Linear attention + full attention every 2nd layer"
    labels = {v.label for v in group_variants([plain, hybrid])}
    assert labels == {"Linear attention + full attention every 2nd layer", "Linear attention"}
    local = _record("attention=full", "+attention@model.hybrid.attention=local",
                    "+model.hybrid.layers=[1]", choices={"model": "vanilla", "attention": "full"})
    assert label_of(local, (("attention", "full"),)) == \
        "Full attention + local attention at layer 1"
    preset = _record("model=samba", "attention=linear",
                     choices={"model": "samba", "attention": "linear"})
    assert label_of(preset, (("model", "samba"), ("attention", "linear"))) == \
        "Samba (Linear attention + local attention every 2nd layer)"
