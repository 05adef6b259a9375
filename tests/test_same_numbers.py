"""Rows whose runs gave bit-identical numbers (:mod:`xformer_bench.results.same_numbers`): named
under the table, as the shipped systems_lm's Local Transformer and Longformer at T = 128."""
from __future__ import annotations

from xformer_bench.results.same_numbers import same_numbers, summary_line
from xformer_bench.results.variants import Variant


def _variant(label, attention, values, status="finished"):
    """A row of ``attention`` whose seed ``s`` ended at ``values[s]`` test bpb."""
    records = tuple({"config": {"attention": {"name": attention, "label": label}, "seed": s},
                     "task": "lm", "seed": s, "status": status,
                     "final": {"val/bpb": value + 0.1, "step": 2000},
                     "test": {"test/bpb": value}}
                    for s, value in enumerate(values))
    return Variant((("attention", attention),), label, records)


LOCAL = [2.3975229263305664, 2.3851842880249023, 2.407674551010132]


def test_rows_with_the_same_numbers_in_every_seed_are_named_once():
    rows = [_variant("Vanilla", "full", [2.3877, 2.4071, 2.4071]),
            _variant("Local", "local", LOCAL), _variant("Longformer", "longformer", LOCAL),
            _variant("BigBird", "bigbird", [2.3851, 2.3947, 2.4063])]
    assert [[v.label for v in g] for g in same_numbers(rows)] == [["Local", "Longformer"]]
    assert summary_line(rows).endswith("one model, not a tie): Local = Longformer.")
    assert summary_line([rows[0], rows[3]]) is None


def test_one_bit_or_one_seed_apart_is_not_the_same():
    close = [LOCAL[0], LOCAL[1], LOCAL[2] + 2.0 ** -40]  # the last seed one rounding away
    assert same_numbers([_variant("Local", "local", LOCAL), _variant("Other", "x", close)]) == []
    one_seed = [_variant("Local", "local", LOCAL[:1]), _variant("Other", "x", LOCAL[:1])]
    assert same_numbers(one_seed) == []  # one equal run could be chance
    fewer = [_variant("Local", "local", LOCAL), _variant("Other", "x", LOCAL[:2])]
    assert same_numbers(fewer) == []  # not the same seeds


def test_a_row_with_an_unfinished_seed_is_left_out():
    rows = [_variant("Local", "local", LOCAL), _variant("Longformer", "longformer", LOCAL)]
    failed = rows[1].records[2] | {"status": "failed", "test": None}
    rows[1] = Variant(rows[1].key, rows[1].label, (*rows[1].records[:2], failed))
    assert same_numbers(rows) == []
