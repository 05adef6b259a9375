"""Beam search against brute force on toy models: with a beam as wide as the search space it
finds the best sequence under GNMT's length penalty; beam 1 is greedy; a narrow beam returns a
valid sequence; each example decodes as if alone within its own length; bos and eos never
appear in the output."""

from __future__ import annotations

import pytest
import torch

from xformer_bench.models.beam_search import beam_search, length_penalty_of

BOS, EOS, V, L = 0, 1, 5, 4


def toy(seed: int, rows_differ: bool = False):
    """Next-token log-probs from a random table over (example, previous token, position)."""
    table = torch.randn(3, V, 8, V, generator=torch.Generator().manual_seed(seed)) * 2
    table[..., BOS] = -1e9  # bos is never generated

    def next_log_probs(prefixes, rows):
        example = rows if rows_differ else torch.zeros_like(rows)
        return table[example, prefixes[:, -1], prefixes.shape[1] - 1].log_softmax(-1)  # (N, V)

    return next_log_probs


def score(model, tokens: list[int], max_len: int, alpha: float, row: int = 0) -> float:
    """The penalised score of an output: eos appended unless it was cut at ``max_len``."""
    generated = tokens if len(tokens) == max_len else [*tokens, EOS]
    log_probs = [float(model(torch.tensor([[BOS, *generated[:i]]]), torch.tensor([row]))[0, t])
                 for i, t in enumerate(generated)]
    return sum(log_probs) / length_penalty_of(len(generated), alpha)


def brute_force(model, max_len: int, alpha: float) -> tuple[list[int], float]:
    """The best output over every sequence ending in eos, or cut at ``max_len``."""
    best, best_score = [], -float("inf")
    for n in range(1, max_len + 1):
        seqs = torch.cartesian_prod(*[torch.arange(V)] * n).reshape(-1, n)  # (V**n, n)
        log_p = torch.zeros(len(seqs))  # (V**n,)
        for i in range(n):
            prefixes = torch.cat([torch.full((len(seqs), 1), BOS), seqs[:, :i]], 1)  # (V**n, i+1)
            step = model(prefixes, torch.zeros(len(seqs), dtype=torch.long))  # (V**n, V)
            log_p += step.gather(1, seqs[:, i:i + 1])[:, 0]
        valid = (seqs[:, :-1] != EOS).all(1) & ((seqs[:, -1] == EOS) | (n == max_len))  # (V**n,)
        scores = torch.where(valid, log_p / length_penalty_of(n, alpha), -float("inf"))
        if float(scores.max()) > best_score:
            best_score, tokens = float(scores.max()), seqs[scores.argmax()].tolist()
            best = tokens[:-1] if tokens[-1] == EOS else tokens
    return best, best_score


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_beam_as_wide_as_the_search_space_is_exact(seed, alpha):
    model = toy(seed)
    found = beam_search(model, 1, bos_id=BOS, eos_id=EOS, beam=V ** L, max_len=L,
                        length_penalty=alpha)[0]
    best, best_score = brute_force(model, L, alpha)
    assert found == best
    assert score(model, found, L, alpha) == pytest.approx(best_score, abs=1e-5)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_narrow_beam_returns_a_valid_sequence_no_better_than_the_best(seed, alpha):
    model = toy(seed)
    found = beam_search(model, 1, bos_id=BOS, eos_id=EOS, beam=2, max_len=L,
                        length_penalty=alpha)[0]
    assert len(found) <= L and BOS not in found and EOS not in found
    assert score(model, found, L, alpha) <= brute_force(model, L, alpha)[1] + 1e-5


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_one_is_the_greedy_argmax_chain(seed, alpha):
    model = toy(seed)
    prefix = [BOS]
    for _ in range(6):
        token = int(model(torch.tensor([prefix]), torch.tensor([0]))[0].argmax())
        if token == EOS:
            break
        prefix.append(token)
    found = beam_search(model, 1, bos_id=BOS, eos_id=EOS, beam=1, max_len=6,
                        length_penalty=alpha)[0]
    assert found == prefix[1:]


def test_each_example_decodes_as_if_alone_within_its_own_length():
    model = toy(3, rows_differ=True)
    limits = torch.tensor([2, 5, 3])
    calls = []

    def recording(prefixes, rows):
        calls.append((prefixes.shape[1], rows.tolist()))
        return model(prefixes, rows)

    together = beam_search(recording, 3, bos_id=BOS, eos_id=EOS, beam=3, max_len=limits)

    def alone(row: int) -> list[int]:
        def one(prefixes, rows):
            return model(prefixes, torch.full_like(rows, row))
        return beam_search(one, 1, bos_id=BOS, eos_id=EOS, beam=3, max_len=int(limits[row]))[0]

    assert together == [alone(r) for r in range(3)]
    assert all(len(t) <= int(n) and BOS not in t and EOS not in t
               for t, n in zip(together, limits))
    # one call a step; an example out of length is no longer asked about
    assert [t for t, _ in calls] == list(range(1, len(calls) + 1))
    assert all(b not in rows for t, rows in calls for b in range(3) if t > int(limits[b]))
    assert all(rows.count(b) <= 3 for _, rows in calls for b in range(3))  # at most beam live


def test_bos_and_the_final_eos_are_stripped_and_max_len_cuts():
    def scripted(prefixes, rows):
        """Certainly 2, then 3, then eos."""
        nxt = torch.tensor([2, 3, EOS, EOS])[prefixes.shape[1] - 1]
        return torch.full((len(prefixes), V), -30.0).index_fill(1, nxt, 0.0)  # (N, V)

    def decode(max_len):
        return beam_search(scripted, 2, bos_id=BOS, eos_id=EOS, beam=2, max_len=max_len)

    assert decode(3) == [[2, 3], [2, 3]]  # eos, the third generated token, stripped
    assert decode(torch.tensor([1, 2])) == [[2], [2, 3]]  # cut at max_len without eos
    assert decode(0) == [[], []]


def late_bloomer(prefixes, rows):
    """eos at once (p 0.5), or 2 (p 0.45) then surely 3, 3, 3 and eos."""
    if prefixes.shape[1] == 1:
        probs = torch.tensor([1e-6, 0.5, 0.45, 0.025, 0.025])
    else:
        probs = torch.full((V,), 1e-13).index_fill(0, torch.tensor(3 if prefixes.shape[1] < 5
                                                                   else EOS), 1.0)
    return probs.log().log_softmax(-1).expand(len(prefixes), V)  # (N, V)


@pytest.mark.parametrize("beam, alpha, best", [
    (1, 0.6, []), (1, 0.0, []), (4, 0.0, []), (4, 0.6, [2, 3, 3, 3]), (V ** 5, 0.6, [2, 3, 3, 3])])
def test_search_goes_on_while_a_longer_hypothesis_can_still_win(beam, alpha, best):
    """[] scores log 0.5 / lp(1) = -0.69; [2, 3, 3, 3] log 0.45 / lp(5) = -0.59 at alpha 0.6.
    Beam 1 stops with its first finished hypothesis (greedy); a wider beam must go on past it,
    since a live one can still win on the length penalty."""
    found = beam_search(late_bloomer, 1, bos_id=BOS, eos_id=EOS, beam=beam, max_len=6,
                        length_penalty=alpha)
    assert found == [best]


@pytest.mark.parametrize("alpha, steps", [(0.0, 1), (0.6, 5)])
def test_the_search_stops_once_no_live_hypothesis_can_beat_the_best_finished(alpha, steps):
    """At alpha 0 the live 2 (log 0.45) can never beat the finished [] (log 0.5): one step."""
    calls = []

    def counted(prefixes, rows):
        calls.append(len(prefixes))
        return late_bloomer(prefixes, rows)

    beam_search(counted, 1, bos_id=BOS, eos_id=EOS, beam=4, max_len=6, length_penalty=alpha)
    assert len(calls) == steps


def test_greedy_reorders_the_cache_only_when_an_example_stops():
    """Every reorder keeps each row's own history: greedy steps where no example stopped move
    nothing and call no reorder; a stop drops that example's row (planted: a recorder that
    ignored the identity would see one call per step)."""
    calls: list[list[int]] = []
    limits = torch.tensor([2, 5, 3])
    model = toy(3, rows_differ=True)
    table_eos_free = lambda prefixes, rows: model(prefixes, rows).index_fill(  # noqa: E731
        1, torch.tensor([EOS]), -1e9)  # no eos: each example runs to its own limit
    out = beam_search(table_eos_free, 3, bos_id=BOS, eos_id=EOS, beam=1, max_len=limits,
                      length_penalty=0.0, reorder=lambda parents: calls.append(parents.tolist()))
    assert [len(o) for o in out] == [2, 5, 3]
    assert calls == [[1, 2], [0]]  # after example 0 stops (step 2), after example 2 (step 3)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_search_is_beam_one_token_for_token_with_the_same_reorders(seed):
    """The vectorised greedy decoder against beam_search at beam 1: per-example lengths that cut
    some examples, others stopping at eos at different steps, and every reorder call alike."""
    from xformer_bench.models.greedy_search import greedy_search

    model = toy(seed, rows_differ=True)
    limits = torch.tensor([5, 1, 3])
    calls = {"beam": [], "greedy": []}
    beam = beam_search(model, 3, bos_id=BOS, eos_id=EOS, beam=1, max_len=limits,
                       length_penalty=0.6, reorder=lambda p: calls["beam"].append(p.tolist()))
    greedy = greedy_search(model, 3, bos_id=BOS, eos_id=EOS, max_len=limits,
                           reorder=lambda p: calls["greedy"].append(p.tolist()))
    assert greedy == beam
    assert calls["greedy"] == calls["beam"]


def test_greedy_search_stops_an_example_whose_every_token_is_impossible():
    from xformer_bench.models.greedy_search import greedy_search

    def dead_end(prefixes, rows):  # example 1 has no possible token at its second step
        log_probs = torch.full((len(rows), V), -5.0)
        log_probs[:, 2] = -0.1
        log_probs[(rows == 1) & (prefixes.shape[1] == 2)] = -float("inf")
        return log_probs

    expected = beam_search(dead_end, 2, bos_id=BOS, eos_id=EOS, beam=1, max_len=3)
    assert greedy_search(dead_end, 2, bos_id=BOS, eos_id=EOS, max_len=3) == expected
    assert expected == [[2, 2, 2], []]
