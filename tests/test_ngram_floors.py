"""The n-gram floors (:mod:`xformer_bench.results.ngram_floors`): interpolated Kneser-Ney
byte models checked against probabilities derived by hand, normalisation, a Markov source of
known entropy rate, the window rule and the cache."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from xformer_bench.results import ngram_floors
from xformer_bench.results.ngram_floors import (KneserNey, cache_key, entropies, floors,
                                                windowed)

WORDS = ("the", "king", "shall", "not", "speak", "of", "my", "lord", "and", "her", "good",
         "night", "what", "say", "you", "to", "this", "be", "thou", "art")


def english_like(n_words: int, seed: int) -> bytes:
    """Random sentences over a small vocabulary: structure at orders 1-3 and beyond."""
    rng = np.random.default_rng(seed)
    words = rng.choice(len(WORDS), size=n_words)
    ends = rng.random(n_words) < 0.15
    return "".join(WORDS[w] + (". " if end else " ") for w, end in zip(words, ends)).encode()


TRANSITIONS = np.array([[0.7, 0.1, 0.1, 0.1],
                        [0.2, 0.2, 0.5, 0.1],
                        [0.05, 0.05, 0.05, 0.85],
                        [0.4, 0.3, 0.2, 0.1]])
"""A first-order Markov source over the bytes b"abcd" (row: current byte, column: next)."""


def markov_bytes(length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cumulative, uniforms = np.cumsum(TRANSITIONS, axis=1), rng.random(length)
    states = np.empty(length, dtype=np.int64)
    state = 0
    for i, u in enumerate(uniforms):
        state = min(int(np.searchsorted(cumulative[state], u)), 3)
        states[i] = state
    return (states + ord("a")).astype(np.uint8)


def markov_entropy_rate() -> float:
    """``H = sum_i pi_i H(row_i)`` with ``pi`` the stationary distribution."""
    values, vectors = np.linalg.eig(TRANSITIONS.T)
    pi = np.real(vectors[:, np.argmin(abs(values - 1))])
    pi /= pi.sum()
    return float(-np.sum(pi[:, None] * TRANSITIONS * np.log2(TRANSITIONS)))


def log2(fraction: Fraction) -> float:
    return math.log2(fraction.numerator) - math.log2(fraction.denominator)


def test_order_two_on_abab_matches_the_hand_derivation():
    # Train b"abab", D1 = D2 = 1/2.  Order 2 (top, raw counts): c(ab) = 2, c(ba) = 1;
    # c(a.) = 2 with N1+(a.) = 1.  Order 1 (continuation counts N1+(. w)): a follows b once,
    # b follows a (twice, but one distinct byte) once: total 2, N1+(.) = 2.
    # P1(a) = (1 - 1/2)/2 + (1/2)(2/2)(1/256) = 1/4 + 1/512 = 129/512 = P1(b); P1(other) = 1/512.
    # P2(b|a) = (2 - 1/2)/2 + (1/2)(1/2) P1(b) = 3/4 + 129/2048 = 1665/2048
    # P2(a|a) = (1/2)(1/2) P1(a) = 129/2048.  The first byte has no history: P1.
    model = KneserNey.fit(b"abab", order=2, discounts=(0.5, 0.5))
    expected = [Fraction(129, 512), Fraction(129, 2048), Fraction(1665, 2048)]
    np.testing.assert_allclose(model.log2_probs(b"aab"), [log2(p) for p in expected],
                               rtol=0, atol=1e-12)
    # An unseen context ("c") passes P1 through; an unseen byte after "a": (1/4)(1/512).
    np.testing.assert_allclose(model.distribution(b"c")[ord("a")], 129 / 512, rtol=1e-12)
    np.testing.assert_allclose(model.distribution(b"a")[ord("z")], 1 / 2048, rtol=1e-12)


def test_order_one_uses_raw_unigram_counts_over_the_uniform_base():
    # Order-1 model (top order, raw counts) on b"abab": c(a) = c(b) = 2, total 4, N1+(.) = 2.
    # P(a) = (2 - 1/2)/4 + (1/2)(2/4)(1/256) = 3/8 + 1/1024 = 385/1024; P(c) = 1/1024.
    model = KneserNey.fit(b"abab", order=1, discounts=(0.5,))
    np.testing.assert_allclose(model.log2_probs(b"ac"),
                               [log2(Fraction(385, 1024)), log2(Fraction(1, 1024))],
                               rtol=0, atol=1e-12)


def test_a_byte_sees_only_its_window():
    # Window 2 over 5 bytes: offsets 0 1 0 1 0 -> orders 1 2 1 2 1 of a 3-gram floor.
    by_order = [np.full(5, -1.0), np.full(5, -2.0), np.full(5, -3.0)]
    np.testing.assert_array_equal(windowed(by_order, 2), [-1, -2, -1, -2, -1])
    np.testing.assert_array_equal(windowed(by_order, 4), [-1, -2, -3, -3, -1])


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("history", [b"", b"t", b"the k", b"of my", b"\x00\x01\x02\x03",
                                     b"ng. t"])
def test_every_conditional_distribution_sums_to_one(order, history):
    model = KneserNey.fit(english_like(400, seed=0), order)
    distribution = model.distribution(history)
    assert distribution.min() > 0
    assert distribution.sum() == pytest.approx(1.0, abs=1e-12)


def test_entropies_fall_from_order_one_to_three_on_english_like_text():
    text = english_like(40_000, seed=1)
    train, val, test = text[:-20_000], text[-20_000:-10_000], text[-10_000:]
    bits, discounts = entropies(train, val, test, window=2048)
    assert bits[1] > bits[2] + 1.0  # measured 3.97 > 2.11 > 1.13 bits per byte
    assert bits[2] > bits[3] + 0.5
    assert all(0 < d < 1 for ds in discounts.values() for d in ds)
    assert [len(discounts[n]) for n in range(1, 6)] == [1, 2, 3, 4, 5]


def test_order_two_reaches_the_entropy_rate_of_a_first_order_markov_source():
    data = markov_bytes(220_000, seed=2)
    bits, _ = entropies(data[:150_000], data[150_000:170_000], data[170_000:], window=10**9)
    rate = markov_entropy_rate()  # 1.443 bits; the order-1 model measures 1.86
    assert bits[2] == pytest.approx(rate, abs=0.005)
    assert bits[1] > rate + 0.3
    assert bits[3] == pytest.approx(rate, abs=0.005)


def test_window_one_scores_every_order_as_the_unigram():
    text = english_like(3_000, seed=3)
    bits, _ = entropies(text[:-4_000], text[-4_000:-2_000], text[-2_000:], window=1)
    assert len({round(b, 12) for b in bits.values()}) == 1


def test_cache_returns_the_same_numbers_and_is_keyed_by_content(tmp_path, monkeypatch):
    text = english_like(6_000, seed=4)
    train, val, test = text[:-8_000], text[-8_000:-4_000], text[-4_000:]
    first = floors(train, val, test, 128, tmp_path)
    assert first == entropies(train, val, test, 128)[0]

    def no_computing(*args, **kwargs):
        raise AssertionError("computed again despite the cache")

    monkeypatch.setattr(ngram_floors, "entropies", no_computing)
    as_array = np.frombuffer(test, dtype=np.uint8)
    assert floors(train, val, as_array, 128, tmp_path) == first
    assert len(list(tmp_path.glob("*.json"))) == 1

    changed = bytes([test[0] ^ 1]) + test[1:]
    assert cache_key(train, val, changed, 128, (1, 2, 3, 4, 5)) \
        != cache_key(train, val, test, 128, (1, 2, 3, 4, 5))
    assert cache_key(train, val, test, 2048, (1, 2, 3, 4, 5)) \
        != cache_key(train, val, test, 128, (1, 2, 3, 4, 5))
    # The split point is part of the key: the same bytes cut differently differ.
    assert cache_key(train + val[:1], val[1:], test, 128, (1, 2, 3, 4, 5)) \
        != cache_key(train, val, test, 128, (1, 2, 3, 4, 5))
    with pytest.raises(AssertionError, match="computed again"):
        floors(train, val, changed, 128, tmp_path)


def test_a_text_run_keeps_its_floors_and_the_table_caption_names_them(tmp_path):
    from conftest import TINY_RUN, choice_groups, compose_config
    from xformer_bench.results.aggregate import build_table
    from xformer_bench.run import execute
    from xformer_bench.results.ngram_floors import floors_sentence
    from xformer_bench.results.table import caption
    from xformer_bench.results.variants import group_variants

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(english_like(6000, seed=3))
    overrides = ["data=text", f"data.path={corpus}", *(o for o in TINY_RUN if "size" not in o),
                 f"paths.data_dir={tmp_path / 'data'}", f"paths.results_dir={tmp_path / 'r'}",
                 "trainer.max_steps=4"]
    config = compose_config(*overrides)
    choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
    record = execute(config, choices, overrides, tmp_path / "run")
    kept = record["ngram_floors"]
    assert kept["window"] == 32 and kept["split"] == "test"
    bits = {int(k): v for k, v in kept["bits_per_byte"].items()}
    assert bits[1] > bits[2] > bits[3] > 0  # English-like text: context helps
    assert list((tmp_path / "data" / "ngram_floors").glob("*.json"))  # cached
    sentence = floors_sentence([record])
    assert f"2-gram {bits[2]:.2f}, 3-gram {bits[3]:.2f}" in sentence and "32-byte" in sentence
    table = build_table("floors", group_variants([record]))
    assert sentence in caption(table, " ± ", "—")
    assert floors_sentence([{**record, "ngram_floors": None}]) is None  # older records
