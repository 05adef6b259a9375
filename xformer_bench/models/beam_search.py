"""Beam search for an autoregressive decoder (Sutskever et al. 2014; Wu et al. 2016), as
Vaswani et al. (2017, section 6.1) decode WMT: beam 4, length penalty alpha = 0.6, at most
source length + 50 tokens.

Scoring.  A finished hypothesis Y scores ``log P(Y) / lp(Y)`` with GNMT's length penalty
``lp(Y) = ((5 + |Y|) / 6) ** alpha`` (Wu et al. 2016, eq. 14), |Y| counting the generated
tokens, the final eos included (bos not); alpha = 0 is plain log-probability.

Each step expands every live hypothesis of an example by every token and takes the best
``2 * beam`` candidates by log-probability.  Those among the best ``beam`` of them that end in
eos are finished (an eos ranked lower is dropped, as in fairseq's SequenceGenerator and
Hugging Face's BeamSearchScorer: with ``beam == 1`` this makes the search the greedy argmax
chain).  The best ``beam`` others stay alive.  At the example's ``max_len`` (eos counts as a
generated token) the live ones are finished as they are.  Candidates of probability zero
(log-probability -inf) are never kept.

Stopping.  An example stops when (a) it has no live hypothesis, or (b) it has ``beam``
finished ones, or (c) its best finished score is at least ``max(live log P) / lp(max_len)``.
(c) is exact for alpha >= 0: log-probabilities only fall as tokens are added and ``lp`` only
grows with length, so a live hypothesis with log-probability s <= 0 ends at best at
``s / lp(max_len)``.  (b) is the usual approximation of beam search (fairseq, Hugging Face's
``early_stopping=True``).  Stopping only on "``beam`` finished *and* (c)" would break greedy
decoding at ``beam == 1``: a finished eos and the runner-up kept alive can later win on the
length penalty.  With a beam as wide as the search space (``beam >= V ** max_len``) nothing is
pruned and (b) cannot fire before the last step, so the search is exact.

All live hypotheses of all unfinished examples go to the model in one call per step, examples
that stopped dropped.  Without ``reorder`` the model recomputes each prefix whole; with it, a
model that keeps a decode cache is told before each step which row of the previous step's
prefixes each new prefix continues (``reorder(parents)``), reorders its cache so, and needs to
score only each prefix's last token.  A step whose prefixes continue the previous step's rows
in order (greedy decoding while no example has stopped) calls no ``reorder``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

NextLogProbs = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(prefixes (N, t) long, rows (N,) long) -> (N, V)`` next-token log-probabilities; ``rows[n]``
is the batch example prefix ``n`` continues."""

Hypothesis = tuple[float, list[int]]
"""(log-probability while live, penalised score once finished; generated tokens)."""


def length_penalty_of(length: int, alpha: float) -> float:
    """GNMT's ``lp(Y) = ((5 + |Y|) / 6) ** alpha`` (Wu et al. 2016, eq. 14)."""
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(next_log_probs: NextLogProbs, batch_size: int, *, bos_id: int, eos_id: int,
                beam: int, max_len: int | torch.Tensor, length_penalty: float = 0.6,
                device: torch.device | None = None,
                reorder: Callable[[torch.Tensor], None] | None = None) -> list[list[int]]:
    """The best hypothesis of each example under the length-penalised score: its generated
    tokens without bos and without the final eos.  ``max_len`` (int or (batch_size,)) is the
    most tokens generated per example, eos included; ``beam == 1`` is greedy decoding.
    ``reorder(parents)``, before every step but the first: ``parents`` (N,) long, the row of
    the previous step's prefixes that each of this step's N prefixes extends."""
    if beam < 1:
        raise ValueError(f"beam={beam} must be at least 1")
    if length_penalty < 0:
        raise ValueError(f"length_penalty={length_penalty} must be >= 0 (the stopping bound "
                         "assumes the penalty grows with length)")
    limits = torch.as_tensor(max_len).expand(batch_size).tolist()
    live: list[list[Hypothesis]] = [[(0.0, [])] for _ in range(batch_size)]
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    active = [b for b in range(batch_size) if limits[b] > 0]
    origins: list[list[int]] = [[0] for _ in range(batch_size)]  # each live one's previous row
    step = 0
    while active:
        step += 1
        if reorder is not None and step > 1:
            parents = [row for b in active for row in origins[b]]
            if parents != list(range(rows_before)):  # greedy, none finished: nothing moves
                reorder(torch.tensor(parents, device=device))
        prefixes = torch.tensor([[bos_id, *tokens] for b in active for _, tokens in live[b]],
                                dtype=torch.long, device=device)  # (N, step)
        rows = torch.tensor([b for b in active for _ in live[b]], device=device)  # (N,)
        log_probs = next_log_probs(prefixes, rows).float()  # (N, V)
        rows_before = len(rows)
        best, where = _top_candidates(log_probs, [live[b] for b in active], beam)  # (A, k) each
        first_row = 0
        for b, scores, flats in zip(active, best.tolist(), where.tolist()):
            width = len(live[b])
            live[b], slots, done = _select(live[b], scores, flats, log_probs.shape[1],
                                           beam=beam, eos_id=eos_id, step=step,
                                           limit=limits[b], alpha=length_penalty)
            origins[b] = [first_row + slot for slot in slots]
            first_row += width
            finished[b] += done
        active = [b for b in active
                  if not _done(live[b], finished[b], beam, limits[b], length_penalty)]
    return [max(f, key=lambda hyp: hyp[0])[1] if f else [] for f in finished]


def _top_candidates(log_probs: torch.Tensor, beams: list[list[Hypothesis]],
                    beam: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The best ``2 * beam`` expansions of each active example by cumulative log-probability:
    (A, k) scores and (A, k) flat indices ``slot * V + token`` into its live hypotheses.  The
    examples' hypotheses are padded to the widest beam with -inf."""
    device, vocab = log_probs.device, log_probs.shape[1]
    width = max(len(hyps) for hyps in beams)
    example, slot = torch.tensor([(a, i) for a, hyps in enumerate(beams)
                                  for i in range(len(hyps))], device=device).T  # (N,) each
    past = torch.tensor([score for hyps in beams for score, _ in hyps], device=device)  # (N,)
    totals = log_probs.new_full((len(beams), width, vocab), -math.inf)  # (A, W, V)
    totals[example, slot] = past[:, None] + log_probs
    return totals.flatten(1).topk(min(2 * beam, width * vocab))  # (A, k), (A, k)


def _select(hyps: list[Hypothesis], scores: list[float], flats: list[int], vocab: int, *,
            beam: int, eos_id: int, step: int, limit: int,
            alpha: float) -> tuple[list[Hypothesis], list[int], list[Hypothesis]]:
    """One example's step from its ranked candidates: (the new live hypotheses, the slot of
    the live hypothesis each extends, the newly finished ones with their penalised scores)."""
    penalty = length_penalty_of(step, alpha)
    kept: list[Hypothesis] = []
    slots: list[int] = []
    done: list[Hypothesis] = []
    for rank, (score, flat) in enumerate(zip(scores, flats)):
        if score == -math.inf:  # padding, or a token of probability zero: so are all after
            break
        tokens, token = hyps[flat // vocab][1], flat % vocab
        if token == eos_id:
            if rank < beam:
                done.append((score / penalty, tokens))
        elif len(kept) < beam:
            kept.append((score, tokens + [token]))
            slots.append(flat // vocab)
    if step >= limit:  # out of length: finished as they are
        done += [(score / penalty, tokens) for score, tokens in kept]
        kept, slots = [], []
    return kept, slots, done


def _done(live: list[Hypothesis], finished: list[Hypothesis], beam: int, limit: int,
          alpha: float) -> bool:
    """The stopping rule (a)-(c) of the module docstring."""
    if not live or len(finished) >= beam:
        return True
    best_live = max(score for score, _ in live)
    return bool(finished) and (max(score for score, _ in finished)
                               >= best_live / length_penalty_of(limit, alpha))
