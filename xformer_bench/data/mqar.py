"""Multi-query associative recall, MQAR (Arora, Eyuboglu, Timalsina, Johnson, Poli, Zou, Rudra &
Ré 2023, "Zoology: Measuring and Improving Recall in Efficient Language Models", section 3):
read key-value pairs, then recall the value of every key when it is asked again, later.

Each example, as zoology's generator ``multiquery_ar`` lays it out (``seq_len`` T even,
``vocab_size`` V, ``n_pairs`` n with 4 n <= T): the pairs ``k_1 v_1 .. k_n v_n`` -- keys
distinct, from ``1 .. V/2 - 1``; values distinct, from ``V/2 .. V - 1`` -- then the T - 2n
query positions, where each key is asked once: key ``k_i`` at position ``2n + 2 g_i``, the gaps
``g_i`` distinct among ``0 .. (T - 2n)/2 - 1`` and drawn with probability proportional to
``power_a * g^(power_a - 1)`` (g = 1, 2, ..: a power law, near queries likelier, as the
distance between repeated bigrams of text).  Every other query position holds a random token
of the whole vocabulary (``random_non_queries``; else 0).  Protocol: next-token prediction; the
target at a query's position is its key's value, every other target ``IGNORE_INDEX``.  Scored:
accuracy over the n queried positions (``scores_accuracy``: the lm task's primary metric,
:data:`~xformer_bench.metric_spec.ACCURACY`) and bits per queried token.  The paper's sweep:
V = 8192, T from 64 to 512, n from 4 to 64.

Examples are generated from ``(data_seed, split, index)`` (:mod:`.seeded_examples`), as
:mod:`.associative_recall`'s: no storage, the same data for every training seed, splits from
disjoint streams.  Zoology draws each split from one seed for all examples instead.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from xformer_bench.data.example_batches import ExampleDataModule
from xformer_bench.data.seeded_examples import seeded_splits, split_sizes
from xformer_bench.errors import ConfigError
from xformer_bench.registry import DATA
from xformer_bench.targets import IGNORE_INDEX

TASK_KEY = 5  # this task's part of every example's seed


def gap_probabilities(space: int, power_a: float) -> np.ndarray:
    """P(gap = g), g = 0 .. space - 1: ``power_a * (g + 1)^(power_a - 1)``, normalised."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def mqar_example(rng: np.random.Generator, seq_len: int, n_pairs: int, vocab_size: int,
                 gaps: np.ndarray, random_non_queries: bool) -> tuple[np.ndarray, np.ndarray]:
    """One example's ``(inputs, targets)``, int64 (seq_len,) each; ``gaps`` are the
    :func:`gap_probabilities` of its query positions."""
    half, context = vocab_size // 2, 2 * n_pairs
    keys = rng.choice(np.arange(1, half), size=n_pairs, replace=False)
    values = rng.choice(np.arange(half, vocab_size), size=n_pairs, replace=False)
    asked = context + 2 * rng.choice(len(gaps), size=n_pairs, replace=False, p=gaps)
    inputs = np.zeros(seq_len, dtype=np.int64)
    inputs[0:context:2], inputs[1:context:2], inputs[asked] = keys, values, keys
    targets = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    targets[asked] = values
    if random_non_queries:
        empty = inputs == 0
        inputs[empty] = rng.integers(0, vocab_size, size=int(empty.sum()))
    return inputs, targets


class MQARDataModule(ExampleDataModule):
    """Key-value pairs, then their queries (task ``lm``, accuracy over the queries first)."""

    task = "lm"
    unit = "tokens"
    scores_accuracy = True

    def __init__(self, *, seq_len: int, n_pairs: int, vocab_size: int, power_a: float,
                 random_non_queries: bool, sizes: dict[str, int], data_seed: int,
                 batch_size: int, seed: int, **loader):
        self.n_pairs, self.vocab_size = n_pairs, vocab_size
        self.scored_per_example = n_pairs  # one scored target per query (the lm task's gather)
        make = partial(mqar_example, seq_len=seq_len, n_pairs=n_pairs, vocab_size=vocab_size,
                       gaps=gap_probabilities((seq_len - 2 * n_pairs) // 2, power_a),
                       random_non_queries=random_non_queries)
        super().__init__(seeded_splits(sizes, make, data_seed=data_seed, task_key=TASK_KEY),
                         batch_size, seed, **loader)


@DATA.register("mqar")
def build(*, seed: int, data_dir: str, seq_len: int, batch_size: int, n_pairs: int = 16,
          vocab_size: int = 8192, power_a: float = 0.01, random_non_queries: bool = True,
          n_train: int = 100_000, n_val: int = 1_000, n_test: int = 3_000, data_seed: int = 0,
          **loader) -> MQARDataModule:
    if n_pairs < 1:
        raise ConfigError(f"data.n_pairs={n_pairs} must be >= 1")
    if seq_len % 2 or 4 * n_pairs > seq_len:
        raise ConfigError(f"data.seq_len={seq_len} must be even and hold {n_pairs} pairs and "
                          f"their queries (4 x data.n_pairs): set data.seq_len="
                          f"{max(4 * n_pairs, seq_len + seq_len % 2)}")
    if n_pairs > vocab_size // 2 - 1:
        raise ConfigError(f"data.vocab_size={vocab_size} has {vocab_size // 2 - 1} keys for "
                          f"data.n_pairs={n_pairs} distinct ones: set data.vocab_size >= "
                          f"{2 * n_pairs + 2}")
    if not power_a > 0:
        raise ConfigError(f"data.power_a={power_a} must be > 0 (1: uniform query positions)")
    return MQARDataModule(seq_len=seq_len, n_pairs=n_pairs, vocab_size=vocab_size,
                          power_a=power_a, random_non_queries=bool(random_non_queries),
                          sizes=split_sizes(n_train, n_val, n_test), data_seed=data_seed,
                          batch_size=batch_size, seed=seed, **loader)
