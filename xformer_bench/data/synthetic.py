"""A synthetic byte corpus generated in-process: no files, no network, deterministic.

A made-up language of ``n_words`` Zipf-distributed words with a first-order Markov
grammar (each word prefers a few successors).  Learnable structure at three scales --
spelling, word transitions, sentence punctuation -- puts the achievable bits per byte
near 1, far below the 8 of uniform bytes.
"""

from __future__ import annotations

import numpy as np

from xformer_bench.data.byte_windows import ByteLMDataModule, split_by_fraction
from xformer_bench.registry import DATA

LETTERS = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", dtype=np.uint8)


def _make_words(rng: np.random.Generator, n_words: int) -> list[bytes]:
    letter_p = 1.0 / np.arange(1, len(LETTERS) + 1)
    letter_p /= letter_p.sum()
    lengths = np.clip(rng.geometric(0.25, size=n_words), 1, 10)
    return [LETTERS[rng.choice(len(LETTERS), size=n, p=letter_p)].tobytes() for n in lengths]


def generate(size: int, seed: int, n_words: int = 512, successors: int = 4,
             p_follow: float = 0.8, sentence_len: int = 12) -> np.ndarray:
    """``size`` bytes of the synthetic language, a pure function of its arguments."""
    rng = np.random.default_rng(seed)
    words = _make_words(rng, n_words)
    zipf = 1.0 / np.arange(1, n_words + 1)
    zipf /= zipf.sum()
    next_words = rng.choice(n_words, size=(n_words, successors), p=zipf)  # grammar
    n_tokens = size // 3 + 16  # every word takes at least 2 bytes with its separator
    follow = rng.random(n_tokens) < p_follow
    pick = rng.integers(0, successors, size=n_tokens)
    fresh = rng.choice(n_words, size=n_tokens, p=zipf)
    ends = rng.random(n_tokens) < 1.0 / sentence_len
    out, word, total = [], 0, 0
    for i in range(n_tokens):
        word = next_words[word, pick[i]] if follow[i] else fresh[i]
        piece = words[word] + (b".\n" if ends[i] else b" ")
        out.append(piece)
        total += len(piece)
        if total >= size:
            break
    return np.frombuffer(b"".join(out)[:size], dtype=np.uint8).copy()


@DATA.register("synthetic")
def build(*, seed: int, data_dir: str, seq_len: int, batch_size: int, size: int = 2_000_000,
          splits: tuple[float, float, float] = (0.9, 0.05, 0.05), **loader) -> ByteLMDataModule:
    corpus = generate(size, seed)
    return ByteLMDataModule(split_by_fraction(corpus, tuple(splits)), seq_len, batch_size,
                            seed, **loader)
