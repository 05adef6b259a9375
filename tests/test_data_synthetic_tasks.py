"""Long-range synthetic tasks: ListOps (generator, evaluator, cache), copy, associative recall."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from xformer_bench.data import listops_generator
from xformer_bench.data.listops_generator import (END_ID, PAD_ID, TOKEN_ID, VOCAB_SIZE, decode,
                                                  encode, evaluate, evaluate_text)
from xformer_bench.errors import ConfigError
from xformer_bench.registry import DATA
from xformer_bench.targets import IGNORE_INDEX

TINY_LISTOPS = {"name": "listops", "max_length": 64, "min_length": 10, "seq_len": 64,
                "n_train": 40, "n_val": 8, "n_test": 8, "batch_size": 4, "eval_batch_size": 8}


def _listops(tmp_path, **changes):
    return DATA.build({**TINY_LISTOPS, **changes}, seed=0, data_dir=str(tmp_path))


# --- ListOps evaluator --------------------------------------------------------------------------

@pytest.mark.parametrize("text,value", [
    ("7", 7),
    ("[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]", 5),
    ("[MIN 4 3 9 ]", 3),
    ("[MAX 0 0 ]", 0),
    ("[MED 1 5 8 9 2 ]", 5),
    ("[MED 1 2 ]", 1),            # even count: mean of the middle two, rounded down (LRA)
    ("[MED 3 6 4 5 ]", 4),        # middle 4, 5 -> 4.5 -> 4
    ("[MED 9 8 ]", 8),
    ("[SM 7 5 ]", 2),             # sum modulo 10
    ("[SM 9 9 9 9 ]", 6),
    ("[SM [MAX 9 1 ] [MIN 9 1 ] ]", 0),
    ("[MIN [MAX 2 [SM 5 6 ] ] [MED 7 [MIN 8 9 ] 9 ] 4 ]", 2),
    ("[MAX [MAX [MAX [MAX 1 2 ] 3 ] 4 ] [MED 0 0 0 ] ]", 4),
])
def test_the_evaluator_on_hand_written_expressions(text, value):
    assert evaluate_text(text) == value
    assert decode(encode(text)) == text
    assert evaluate([*encode(text), PAD_ID, PAD_ID]) == value  # padding is ignored


def test_the_median_matches_numpy_as_lra_computes_it():
    rng = random.Random(0)
    for _ in range(200):
        args = [rng.randrange(10) for _ in range(rng.randint(2, 10))]
        assert listops_generator.median(args) == int(np.median(args))


@pytest.mark.parametrize("text", ["[MAX 1 2", "1 2", "]", "[SM 1 ] ]", ""])
def test_the_evaluator_rejects_ill_formed_expressions(text):
    with pytest.raises(ValueError):
        evaluate_text(text)


def test_sixteen_tokens_pad_first():
    assert VOCAB_SIZE == 16 and PAD_ID == 0 and TOKEN_ID["0"] == 1 and END_ID == 15


# --- ListOps data -------------------------------------------------------------------------------

def test_generated_expressions_are_well_formed_and_labelled_by_the_evaluator(tmp_path):
    dm = _listops(tmp_path)
    assert (dm.task, dm.unit, dm.input_kind) == ("classify", "examples", "tokens")
    assert (dm.num_classes, dm.vocab_size, dm.pad_id) == (10, 16, 0)
    seen = set()
    for split in ("train", "val", "test"):
        examples = dm.splits[split]
        tokens, labels = examples.batch(np.arange(len(examples)), None)
        assert tokens.dtype == labels.dtype == torch.int64 and tokens.shape[1] == 64
        for row, label in zip(tokens.tolist(), labels.tolist()):
            length = sum(t != PAD_ID for t in row)
            assert 10 < length < 64
            assert all(t != PAD_ID for t in row[:length]) and all(t == PAD_ID for t in row[length:])
            expression = row[:length]
            opened = sum(t in listops_generator.APPLY for t in expression)
            assert opened == expression.count(END_ID) >= 1 and expression[-1] == END_ID
            assert label == evaluate(expression) == evaluate_text(decode(row))
            seen.add(tuple(expression))
    assert len(seen) == 40 + 8 + 8  # no expression twice, within or across splits


def test_the_data_depends_on_data_seed_only(tmp_path):
    a = _listops(tmp_path / "a").splits["test"].tokens
    again = DATA.build(TINY_LISTOPS, seed=7, data_dir=str(tmp_path / "b")).splits["test"].tokens
    other = _listops(tmp_path / "c", data_seed=1).splits["test"].tokens
    assert np.array_equal(a, again)  # another training seed, another folder: the same data
    assert not np.array_equal(a, other)


def test_the_cache_is_reused_and_keyed_by_every_parameter(tmp_path, monkeypatch):
    first = _listops(tmp_path)
    [folder] = (tmp_path / "listops").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        f"{s}_{kind}.npy" for s in ("train", "val", "test") for kind in ("tokens", "labels"))

    def refuse(*args, **kwargs):
        raise AssertionError("regenerated a cached data set")

    monkeypatch.setattr(listops_generator, "generate", refuse)
    second = _listops(tmp_path)
    assert isinstance(second.splits["train"].tokens, np.memmap)
    assert np.array_equal(first.splits["train"].tokens, second.splits["train"].tokens)
    with pytest.raises(AssertionError, match="regenerated"):
        _listops(tmp_path, max_depth=9)  # a different parameter is a different data set
    assert [p.name for p in (tmp_path / "listops").iterdir()] == [folder.name]  # nothing partial


def test_listops_batches_from_the_training_loader_without_a_trainer(tmp_path):
    dm = _listops(tmp_path)
    tokens, labels = next(iter(dm.train_dataloader()))
    assert tokens.shape == (4, 64) and labels.shape == (4,)
    assert int(labels.min()) >= 0 and int(labels.max()) < 10
    inputs, labels = next(iter(dm.val_dataloader()))
    assert inputs.shape == (8, 64)


def test_listops_config_errors_are_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"set data.seq_len=64") as error:
        _listops(tmp_path, seq_len=32)
    assert "\n" not in str(error.value)
    # a window with too few distinct expressions (only [OP d d ]): an error, not an endless loop
    original = listops_generator.generate
    monkeypatch.setattr(listops_generator, "generate",
                        lambda *a, **k: original(*a, **{**k, "patience": 2000}))
    with pytest.raises(ConfigError, match="widen the length window") as error:
        _listops(tmp_path, min_length=3, max_length=5, seq_len=5, n_train=1000)
    assert "\n" not in str(error.value)
    assert not any(p.name.endswith(".partial") for p in (tmp_path / "listops").iterdir())


# --- copy ---------------------------------------------------------------------------------------

COPY = {"name": "copy", "length": 12, "seq_len": 24, "n_symbols": 10, "n_train": 64,
        "n_val": 50, "n_test": 50, "batch_size": 4}


def test_copy_scores_the_second_half_only():
    dm = DATA.build(COPY, seed=0, data_dir="unused")
    assert (dm.task, dm.unit, dm.vocab_size) == ("lm", "tokens", 11)
    inputs, targets = dm.splits["train"].batch(np.arange(16), None)
    assert inputs.shape == targets.shape == (16, 24) and inputs.dtype == targets.dtype == torch.int64
    n = 12
    scored = targets[:, :-1] != IGNORE_INDEX  # the usual shift: a target is the next input
    assert torch.equal(targets[:, :-1][scored], inputs[:, 1:][scored])
    assert (targets[:, :n] == IGNORE_INDEX).all()
    assert torch.equal(targets[:, n:], inputs[:, :n])  # the copy, predicted from n back
    assert (inputs[:, n] == 10).all() and (inputs[:, :n] < 10).all()  # separator after x
    assert torch.equal(inputs[:, n + 1:], inputs[:, :n - 1])  # the copy so far is input


def test_copy_examples_are_fixed_by_data_seed_and_splits_disjoint():
    a, b = (DATA.build(COPY, seed=s, data_dir="unused") for s in (0, 1))
    other = DATA.build({**COPY, "data_seed": 3}, seed=0, data_dir="unused")
    index = np.arange(50)
    assert torch.equal(a.splits["val"].batch(index, None)[0], b.splits["val"].batch(index, None)[0])
    assert not torch.equal(a.splits["val"].batch(index, None)[0], other.splits["val"].batch(index, None)[0])
    rows = {split: {tuple(r) for r in a.splits[split].batch(index, None)[0].tolist()}
            for split in ("train", "val", "test")}
    assert len(rows["train"]) == len(rows["val"]) == len(rows["test"]) == 50
    assert not (rows["train"] & rows["test"]) and not (rows["val"] & rows["test"])


def test_copy_seq_len_must_be_twice_the_length():
    with pytest.raises(ConfigError, match=r"set data.seq_len=24$") as error:
        DATA.build({**COPY, "seq_len": 25}, seed=0, data_dir="unused")
    assert "\n" not in str(error.value)


def test_copy_trains_from_the_loader_without_a_trainer():
    inputs, targets = next(iter(DATA.build(COPY, seed=0, data_dir="unused").train_dataloader()))
    assert inputs.shape == targets.shape == (4, 24)


# --- associative recall -------------------------------------------------------------------------

RECALL = {"name": "associative_recall", "n_pairs": 8, "seq_len": 17, "n_keys": 10,
          "n_values": 6, "n_train": 64, "n_val": 16, "n_test": 16, "batch_size": 4}


def test_associative_recall_scores_the_queried_value_only():
    dm = DATA.build(RECALL, seed=0, data_dir="unused")
    assert (dm.task, dm.unit, dm.vocab_size) == ("lm", "tokens", 16)
    inputs, targets = dm.splits["train"].batch(np.arange(32), None)
    assert inputs.shape == targets.shape == (32, 17) and inputs.dtype == targets.dtype == torch.int64
    assert (targets[:, :-1] == IGNORE_INDEX).all()
    for row, answer in zip(inputs.tolist(), targets[:, -1].tolist()):
        keys, values, query = row[0:16:2], row[1:16:2], row[16]
        assert all(k < 10 for k in keys) and all(10 <= v < 16 for v in values)
        assert len(set(keys)) == 8 and query in keys
        assert answer == values[keys.index(query)]


def test_associative_recall_checks_its_sizes():
    with pytest.raises(ConfigError, match=r"set data.seq_len=17$"):
        DATA.build({**RECALL, "seq_len": 16}, seed=0, data_dir="unused")
    with pytest.raises(ConfigError, match="n_pairs"):
        DATA.build({**RECALL, "n_pairs": 11, "seq_len": 23}, seed=0, data_dir="unused")
    val = DATA.build(RECALL, seed=0, data_dir="unused").splits["val"].batch(np.arange(16), None)
    test = DATA.build(RECALL, seed=0, data_dir="unused").splits["test"].batch(np.arange(16), None)
    assert not torch.equal(val[0], test[0])


def test_associative_recall_trains_from_the_loader_without_a_trainer():
    inputs, targets = next(iter(DATA.build(RECALL, seed=0, data_dir="unused").train_dataloader()))
    assert inputs.shape == targets.shape == (4, 17)
