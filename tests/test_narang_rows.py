"""Narang et al. 2021 Table 1's architecture rows: transparent attention (Bapna et al. 2018),
the Weighted Transformer (Ahmed et al. 2017), the Evolved Transformer (So et al. 2019) and
encoder-only / decoder-only block sharing -- each checked against its paper's equations by an
explicit computation, trained for two steps through the run path, and refused in one line
where it does not apply."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import SMALL_DIMS, changed_future, choice_groups, compose_config, seeded_model

from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.transformer_seq2seq import EncoderDecoder
from xformer_bench.position import Position

DIMS = ModelDims(d_model=32, n_heads=2, n_layers=3, d_ff=64, seq_len=16, vocab_size=20)
PARTS = ({"name": "layernorm"}, {"name": "gelu"}, {"name": "sinusoidal"})


def _seq2seq(attention="full", ffn="dense", stack="standard", seed=0, **options):
    torch.manual_seed(seed)
    norm, activation, position = PARTS
    return EncoderDecoder(DIMS, {"name": attention}, norm, activation, position, {"name": ffn},
                          {"name": stack}, pad_id=0, **options).eval()


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    source, target = torch.randint(1, 20, (2, 9), generator=g), torch.randint(1, 20, (2, 7), generator=g)
    source[1, 6:] = 0  # padding
    return source, target


def _unique(module: torch.nn.Module) -> int:
    return len({id(p) for p in module.parameters()})


# -- transparent attention -----------------------------------------------------------------------

def test_transparent_weights_are_a_softmax_over_encoder_layers_one_vector_per_decoder_layer():
    model = _seq2seq(transparent_attention=True)
    crosses = [block.cross_attention for block in model.stack.blocks]
    assert len({id(c.layer_logits) for c in crosses}) == DIMS.n_layers  # W: one column per layer
    for cross in crosses:
        torch.nn.init.normal_(cross.layer_logits)
        weights = cross.layer_weights()
        assert weights.shape == (DIMS.n_layers + 1,)  # the embedding and every encoder layer
        torch.testing.assert_close(weights.sum(), torch.tensor(1.0))
        manual = cross.layer_logits.exp() / cross.layer_logits.exp().sum()
        torch.testing.assert_close(weights, manual.detach())


def test_transparent_combination_equals_a_hand_computation_and_reduces_to_the_standard_model():
    model, standard = _seq2seq(transparent_attention=True), _seq2seq()
    source, target = _batch()
    states, _ = model.encode(source)  # (B, N + 1, S, D)
    assert states.shape[1] == DIMS.n_layers + 1
    # the last state is the standard encoder's output (same weights: same seed, same names)
    standard.load_state_dict(model.state_dict(), strict=False)
    torch.testing.assert_close(states[:, -1], standard.encode(source)[0])
    cross = model.stack.blocks[1].cross_attention
    torch.nn.init.normal_(cross.layer_logits)
    w = torch.softmax(cross.layer_logits.detach(), 0)
    by_hand = sum(w[j] * states[:, j] for j in range(DIMS.n_layers + 1))
    torch.testing.assert_close(cross.combine(states), by_hand)
    # all weight on the last encoder layer: exactly the standard encoder-decoder
    for block in model.stack.blocks:
        block.cross_attention.layer_logits.data = torch.tensor([-1e4] * DIMS.n_layers + [1e4])
    torch.testing.assert_close(model(source, target), standard(source, target))


# -- Weighted Transformer ------------------------------------------------------------------------

def test_weighted_branch_weights_lie_on_the_simplex_and_the_output_is_the_hand_combination():
    model = seeded_model("modification=weighted_transformer", *SMALL_DIMS)
    mixer = model.stack.blocks[0].attention
    for logits in (mixer.kappa_logits, mixer.alpha_logits):
        torch.nn.init.normal_(logits)
    for weights in (mixer.kappa(), mixer.alpha()):
        assert (weights >= 0).all() and math.isclose(weights.sum().item(), 1.0, rel_tol=1e-6)
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
    out = mixer(x, ForwardContext(Position(), causal=True))
    # by hand: M = 2 heads of Dh = 16, each its own attention, W^{O_i}, kappa_i, FFN_i, alpha_i
    h, dh, t = 2, 16, 5
    q, k, v = mixer.qkv(x).split(32, dim=-1)
    expected = torch.zeros_like(x)
    for i in range(h):
        cols = slice(i * dh, (i + 1) * dh)
        logits = q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(dh)
        logits = logits.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
        head = torch.softmax(logits, -1) @ v[..., cols]  # (B, T, Dh)
        head_bar = head @ mixer.out.weight[:, cols].t() * mixer.kappa()[i]
        ffn = mixer.branches
        inner = torch.relu(head_bar @ ffn.w1[i] + ffn.b1[i])
        expected = expected + mixer.alpha()[i] * (inner @ ffn.w2[i] + ffn.b2[i])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


# -- Evolved Transformer -------------------------------------------------------------------------

def _encoder_cell_by_hand(d: int, f: int) -> int:
    ln = 2 * d
    return (4 * ln + 2 * 4 * d                     # N before the 4 branches; N_{4D}
            + 2 * (d * d + d)                      # GLU: values, gates
            + (d * 4 * d + 4 * d)                  # Conv 1x1: 4D, ReLU
            + (3 * d * d // 2 + d // 2)            # Conv 3x1: D/2, ReLU
            + (9 * 4 * d + 4 * d * d // 2 + d // 2)  # Sep Conv 9x1: D/2 (depthwise, pointwise)
            + (4 * d * d + 4 * d)                  # 8-head self-attention (q, k, v, out)
            + (d * f + f + f * d + d))             # Conv 1x1: d_ff ReLU, Conv 1x1: D


def _decoder_cell_by_hand(d: int, f: int, encoder: bool) -> int:
    ln, attention = 2 * d, 4 * d * d + 4 * d
    return ((5 if encoder else 4) * ln + 2 * 2 * d + 2 * f  # N; N_{2D}; N_{d_ff}
            + attention                            # 16-head self-attention
            + (11 * d + d * 2 * d + 2 * d)         # Sep Conv 11x1: 2D, ReLU
            + (7 * d + d * d // 2 + d // 2)        # Sep Conv 7x1: D/2
            + (7 * 2 * d + 2 * d * d + d)          # Sep Conv 7x1: D
            + attention                            # 8-head self-attention
            + (2 * attention if encoder else 0)    # attend to encoder, twice
            + (d * f + f + f * d + d))             # Conv 1x1: d_ff Swish, N, Conv 1x1: D


def test_evolved_cells_have_the_parameters_of_the_papers_diagram():
    model = _seq2seq(stack="evolved")
    d, f = DIMS.d_model, DIMS.d_ff
    for cell in model.encoder.stack.blocks:
        assert sum(p.numel() for p in cell.parameters()) == _encoder_cell_by_hand(d, f)
    for cell in model.stack.blocks:
        assert sum(p.numel() for p in cell.parameters()) == _decoder_cell_by_hand(d, f, True)
        assert cell.wide_attention.n_heads == 16 and cell.attention.n_heads == DIMS.n_heads
    lm = seeded_model("modification=evolved_transformer", *SMALL_DIMS)
    for cell in lm.stack.blocks:
        assert sum(p.numel() for p in cell.parameters()) == _decoder_cell_by_hand(32, 64, False)


def test_evolved_decoder_is_causal():
    model = seeded_model("modification=evolved_transformer", *SMALL_DIMS).eval()
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    other = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    changed_future(model, tokens, 9, other)
    seq2seq = _seq2seq(stack="evolved")
    source, target = _batch()
    changed = target.clone()
    changed[:, 4:] = (target[:, 4:] % 19) + 1
    a, b = seq2seq(source, target), seq2seq(source, changed)
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=1e-5, rtol=0)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


# -- block sharing by side ----------------------------------------------------------------------

@pytest.mark.parametrize("side", ["encoder", "decoder", True, False])
def test_one_sided_sharing_shares_exactly_that_sides_blocks(side):
    model, unshared = _seq2seq(share_blocks=side), _seq2seq()
    encoder_shared, decoder_shared = side in ("encoder", True), side in ("decoder", True)
    assert len(model.encoder.stack.blocks) == (1 if encoder_shared else DIMS.n_layers)
    assert len(model.stack.blocks) == (1 if decoder_shared else DIMS.n_layers)
    per_block = {name: _unique(stack.blocks[0])
                 for name, stack in (("encoder", unshared.encoder.stack), ("decoder", unshared.stack))}
    saved = (DIMS.n_layers - 1) * (per_block["encoder"] * encoder_shared
                                   + per_block["decoder"] * decoder_shared)
    assert _unique(model) == _unique(unshared) - saved
    assert _unique(model.encoder.stack) == per_block["encoder"] * len(model.encoder.stack.blocks)


def test_shared_blocks_preset_is_the_sharing_modification():
    alias, bundle = compose_config("model=shared_blocks"), compose_config("modification=sharing")
    assert alias["model"]["share_blocks"] is True and bundle["model"]["share_blocks"] is True
    assert alias["modification"]["name"] == bundle["modification"]["name"] == "sharing"


# -- refusals and tiny runs ---------------------------------------------------------------------

@pytest.mark.parametrize("overrides,words", [
    (("modification=transparent_attention",), "transparent_attention=true needs an encoder and a "
                                              "decoder .* which a decoder-only LM does not"),
    (("modification=sharing_encoder",), "share_blocks=encoder needs an encoder and a decoder"),
    (("modification=sharing_decoder",), "share_blocks=decoder needs an encoder and a decoder"),
    (("modification=evolved_transformer", "model.norm_placement=post"),
     "stack=evolved needs pre-LN blocks"),
    (("modification=evolved_transformer", "ffn=switch"), "stack=evolved needs a dense position-wise"),
    (("modification=evolved_transformer", "norm=rezero"), "stack=evolved needs a norm without a "
                                                          "residual gate"),
])
def test_an_inapplicable_row_is_refused_in_one_line(overrides, words):
    with pytest.raises(ConfigError, match=words) as error:
        build_model(compose_config(*overrides, *SMALL_DIMS), vocab_size=64)
    assert "\n" not in str(error.value) and "choose another" in str(error.value)


def test_transparent_attention_needs_a_stack_with_one_output_per_layer():
    with pytest.raises(ConfigError, match="choose stack=standard"):
        _seq2seq(stack="evolved", transparent_attention=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from test_data_wmt14 import _write_folder

    folder = tmp_path_factory.mktemp("corpus")
    _write_folder(folder, sizes=(("train", 60), ("valid", 4), ("test", 4)))
    return folder


TRANSLATE = ("data=wmt14", "data.vocab_size=120", "data.subset=null", "data.seq_len=32",
             "data.max_source_len=24", "data.max_target_len=24", "data.batch_size=8",
             "data.eval_batch_size=4", "eval.beam=2", "eval.max_extra_len=4")


def _run(tmp_path, *overrides):
    from xformer_bench.run import execute

    overrides = ("model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.d_ff=64",
                 "trainer.max_steps=2", "optim.warmup_steps=1", "trainer.progress_bar=false",
                 "logger=none", f"paths.data_dir={tmp_path / 'data'}",
                 f"paths.results_dir={tmp_path / 'results'}", *overrides)
    config = compose_config(*overrides)
    choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
    return execute(config, choices, list(overrides), tmp_path / "run")


@pytest.mark.parametrize("row", ["transparent_attention", "evolved_transformer",
                                 "weighted_transformer", "sharing_encoder", "sharing_decoder"])
def test_each_row_trains_on_parallel_text(tmp_path, corpus, row):
    record = _run(tmp_path, *TRANSLATE, f"data.path={corpus}", f"modification={row}")
    assert record["status"] == "finished" and math.isfinite(record["final"]["val/loss"])


@pytest.mark.parametrize("row", ["evolved_transformer", "weighted_transformer"])
def test_decoder_rows_train_as_a_byte_lm(tmp_path, row):
    record = _run(tmp_path, "data.size=4000", "data.seq_len=32", "data.batch_size=4",
                  f"modification={row}")
    assert record["status"] == "finished" and math.isfinite(record["final"]["val/loss"])
