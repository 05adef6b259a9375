"""Beam search against brute force: with a beam as wide as the search space it finds the best
sequence under GNMT's length penalty; beam 1 is greedy; each example decodes as if alone."""

from __future__ import annotations

import itertools

import pytest
import torch

from xformer_bench.models.beam_search import beam_search, length_penalty_of

BOS, EOS, V = 0, 1, 4


def toy(seed: int, rows_differ: bool = False):
    """Next-token log-probs from a table over (example, previous token, position)."""
    table = torch.randn(3, V, 8, V, generator=torch.Generator().manual_seed(seed)) * 2
    table[..., BOS] = -1e9  # bos is never generated

    def next_log_probs(prefixes, rows):
        example = rows if rows_differ else torch.zeros_like(rows)
        logits = table[example, prefixes[:, -1], prefixes.shape[1] - 1]  # (N, V)
        return logits.log_softmax(-1)

    return next_log_probs


def brute_force(next_log_probs, max_len: int, alpha: float, row: int = 0) -> list[int]:
    best, best_score = None, -float("inf")
    for n in range(1, max_len + 1):
        for tokens in itertools.product(range(V), repeat=n):
            if BOS in tokens or EOS in tokens[:-1]:
                continue
            prefix = torch.tensor([[BOS, *tokens]])
            log_probs = [next_log_probs(prefix[:, :i + 1], torch.tensor([row]))[0, tokens[i]]
                         for i in range(n)]
            if tokens[-1] != EOS and n < max_len:
                continue  # unfinished before the limit: not a complete hypothesis
            score = float(sum(log_probs)) / length_penalty_of(n, alpha)
            if score > best_score:
                best_score = score
                best = list(tokens[:-1] if tokens[-1] == EOS else tokens)
    return best


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_beam_as_wide_as_the_search_space_is_exact(seed, alpha):
    model = toy(seed)
    found = beam_search(model, 1, bos_id=BOS, eos_id=EOS, beam=V ** 4, max_len=4,
                        length_penalty=alpha)
    assert found[0] == brute_force(model, 4, alpha)


def test_beam_one_is_the_greedy_argmax_chain():
    model = toy(7)
    prefix = [BOS]
    for _ in range(6):
        token = int(model(torch.tensor([prefix]), torch.tensor([0]))[0].argmax())
        if token == EOS:
            break
        prefix.append(token)
    assert beam_search(model, 1, bos_id=BOS, eos_id=EOS, beam=1, max_len=6)[0] == prefix[1:]


def test_each_example_decodes_as_if_alone_within_its_own_length():
    model = toy(3, rows_differ=True)
    limits = torch.tensor([2, 5, 3])
    together = beam_search(model, 3, bos_id=BOS, eos_id=EOS, beam=3, max_len=limits)

    def alone(row: int) -> list[int]:
        def one(prefixes, rows):
            return model(prefixes, torch.full_like(rows, row))
        return beam_search(one, 1, bos_id=BOS, eos_id=EOS, beam=3, max_len=int(limits[row]))[0]

    assert together == [alone(r) for r in range(3)]
    assert all(len(t) <= int(n) and BOS not in t and EOS not in t
               for t, n in zip(together, limits))
