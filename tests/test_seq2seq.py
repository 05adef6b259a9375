"""The encoder-decoder: the decoder is causal, source padding is invisible, the source matters,
both sides take every option that fits them, inapplicable stacks are refused in one line."""

from __future__ import annotations

import pytest
import torch

from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.transformer_seq2seq import EncoderDecoder

DIMS = ModelDims(d_model=32, n_heads=2, n_layers=2, d_ff=64, seq_len=16, vocab_size=20)
PARTS = ({"name": "layernorm"}, {"name": "gelu"}, {"name": "sinusoidal"}, {"name": "dense"})


def _model(attention: str = "full", stack: str = "standard", position: str = "sinusoidal"):
    torch.manual_seed(0)
    norm, activation, _, ffn = PARTS
    return EncoderDecoder(DIMS, {"name": attention}, norm, activation, {"name": position}, ffn,
                          {"name": stack}, pad_id=0).eval()


@pytest.mark.parametrize("attention,position", [("full", "sinusoidal"), ("full", "rotary"),
                                                ("local", "t5"), ("performer", "learned")])
def test_the_decoder_never_sees_later_target_tokens(attention, position):
    model = _model(attention, position=position)
    source, target = torch.randint(1, 20, (2, 12)), torch.randint(1, 20, (2, 10))
    changed = target.clone()
    changed[:, 6:] = torch.randint(1, 20, (2, 4))
    with torch.random.fork_rng():
        a = model(source, target)
    with torch.random.fork_rng():
        b = model(source, changed)
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_source_padding_is_invisible_and_the_source_matters():
    model = _model()
    source, target = torch.randint(1, 20, (1, 9)), torch.randint(1, 20, (1, 7))
    padded = torch.cat([source, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(source, target), model(padded, target), atol=1e-5, rtol=1e-4)
    other = torch.randint(1, 20, (1, 9))
    assert not torch.allclose(model(source, target), model(other, target))


@pytest.mark.parametrize("stack,words", [("reversible", "encoder-decoder's decoder"),
                                         ("recurrent", "independent"), ("compressive", "independent")])
def test_stacks_that_cannot_serve_a_translator_are_refused_in_one_line(stack, words):
    with pytest.raises(ConfigError, match=words) as error:
        _model(stack=stack)
    assert "\n" not in str(error.value)


def test_a_bidirectional_only_attention_is_refused_by_the_decoder():
    with pytest.raises(ConfigError, match="decoder needs causal"):
        _model("linformer")


def test_teacher_forced_loss_falls_on_a_copy_task():
    model = _model().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(1)
    losses = []
    for _ in range(200):
        source = torch.randint(3, 20, (16, 8))
        target = torch.cat([torch.ones(16, 1, dtype=torch.long), source], dim=1)  # bos = 1
        log_probs = model(source, target[:, :-1])
        loss = torch.nn.functional.nll_loss(log_probs.flatten(0, 1), target[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
