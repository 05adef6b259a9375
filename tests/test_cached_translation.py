"""Translation decodes from a key/value cache reordered with the beam: the same translations
as recomputing every prefix, one new position a step; a decoder the cache cannot serve falls
back to recomputing, and says so in the record's decoding protocol."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from xformer_bench.core.decode_cache import DecodeCache
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.transformer_seq2seq import EncoderDecoder
from xformer_bench.tasks.translate import TranslationTask

DIMS = ModelDims(d_model=32, n_heads=2, n_layers=2, d_ff=64, seq_len=24, vocab_size=12)
PAD, BOS, EOS = 0, 1, 2


def _task(attention: str = "full", position: str = "sinusoidal", stack: str = "standard",
          **options):
    torch.manual_seed(0)
    model = EncoderDecoder(DIMS, {"name": attention}, {"name": "layernorm"}, {"name": "gelu"},
                           {"name": position}, {"name": "dense"}, {"name": stack},
                           pad_id=PAD, **options).eval()
    data = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS, decode=str, references=None)
    return TranslationTask(model, data, {}, max_steps=2, eval_options={})


def _sources() -> torch.Tensor:
    torch.manual_seed(1)
    source = torch.randint(3, DIMS.vocab_size, (5, 9))
    source[1, 5:] = PAD  # rows of different lengths: different max_len, rows drop out
    source[3, 3:] = PAD
    return source


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("attention,position,options", [
    ("full", "sinusoidal", {}), ("local", "rotary", {}), ("multi_query", "learned", {}),
    ("full", "sinusoidal", {"transparent_attention": True})])
def test_cached_beam_search_translates_as_recomputing_every_prefix(beam, attention, position,
                                                                   options):
    task = _task(attention, position, **options)
    assert task.cached
    with torch.no_grad():
        cached = task.translate(_sources(), beam)
        task.cached = False
        whole = task.translate(_sources(), beam)
    assert cached == whole
    assert any(len(ids) > 3 for ids in whole)  # long enough for the beam to reorder


def test_cached_decoding_feeds_one_position_a_step_and_a_stale_cache_is_caught(monkeypatch):
    task = _task()
    widths: list[int] = []
    decode = task.model.decode

    def counted(target, *args, **kwargs):
        widths.append(target.shape[1])
        return decode(target, *args, **kwargs)

    projections: list[int] = []  # the encoder output's key/value projections, per layer
    for block in task.model.stack.blocks:
        block.cross_attention.key_value.register_forward_hook(
            lambda module, args, out: projections.append(args[0].shape[0]))
    monkeypatch.setattr(task.model, "decode", counted)
    with torch.no_grad():
        reference = task.translate(_sources(), 4)
    assert widths[0] == 1 and set(widths[1:]) == {1} and len(widths) > 3
    assert projections == [5] * DIMS.n_layers  # once, at the first step, kept in the cache
    # planted: a cache that is not reordered with the beam gives other translations or fails
    monkeypatch.setattr(DecodeCache, "reorder", lambda self, rows: None)
    try:
        with torch.no_grad():
            stale = task.translate(_sources(), 4)
    except RuntimeError:
        stale = None
    assert stale != reference


def test_a_decoder_the_cache_cannot_serve_recomputes_and_the_record_says_so():
    task = _task(attention="axial")  # lays its grid over the queries it is given
    assert not task.cached and task.record_fields()["decoding"]["cache"] is False
    with torch.no_grad():
        assert len(task.translate(_sources(), 2)) == 5


def test_reorder_takes_batch_rows_of_every_slot_but_shared_taps():
    cache = DecodeCache()
    keys = torch.arange(3.0).view(3, 1, 1, 1)
    cache.slots = [{"keys": keys, "values": keys + 10, "taps": torch.arange(4.0).view(2, 2)},
                   {"state": (keys[:, 0], {"conv": keys[:, 0, 0]})}]
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.slots[0]["keys"].flatten().tolist() == [2.0, 2.0, 0.0]
    assert cache.slots[0]["values"].flatten().tolist() == [12.0, 12.0, 10.0]
    assert cache.slots[0]["taps"].tolist() == [[0.0, 1.0], [2.0, 3.0]]  # shared: untouched
    state, inner = cache.slots[1]["state"]
    assert state.flatten().tolist() == [2.0, 2.0, 0.0]
    assert inner["conv"].flatten().tolist() == [2.0, 2.0, 0.0]
