"""Beam search for an autoregressive decoder (Sutskever et al. 2014; Wu et al. 2016), as
Vaswani et al. (2017, section 6.1) decode WMT: beam 4, length penalty alpha = 0.6, at most
source length + 50 tokens.

A hypothesis Y (its generated tokens, the final eos included) scores ``log P(Y) / lp(Y)`` with
GNMT's length penalty ``lp(Y) = ((5 + |Y|) / 6) ** alpha`` (Wu et al. 2016, eq. 14; alpha = 0:
plain log-probability).  Each step expands every live hypothesis of an example by every token,
keeps the best ``2 * beam`` candidates by log-probability, files those among the best
``beam`` that end in eos as finished (as fairseq does), and keeps the best ``beam`` others
alive; at the example's ``max_len`` the live ones
are finished as they are.

Stopping: an example stops when it has ``beam`` finished hypotheses, or when no live one can
still beat its best finished one.  The second test is exact for alpha >= 0: log-probabilities
only fall as tokens are added and ``lp`` only grows, so a live hypothesis with log-probability
s < 0 can end at best at ``s / lp(max_len)``.  (The first is the usual approximation of beam
search; with a beam as wide as the search space it never fires before the second, and the
search is exact.)  ``beam == 1`` is greedy decoding.

All live hypotheses of all unfinished examples go to the model in one call per step; the model
recomputes each prefix whole (no key/value cache).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NextLogProbs = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(prefixes (N, t) long, rows (N,) long) -> (N, V)`` next-token log-probabilities; ``rows[n]``
is the batch example prefix ``n`` continues."""


def length_penalty_of(length: int, alpha: float) -> float:
    """GNMT's ``((5 + |Y|) / 6) ** alpha``."""
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(next_log_probs: NextLogProbs, batch_size: int, *, bos_id: int, eos_id: int,
                beam: int, max_len: int | torch.Tensor, length_penalty: float = 0.6,
                device: torch.device | None = None) -> list[list[int]]:
    """The best hypothesis of each example: its generated tokens without bos and final eos."""
    if beam < 1:
        raise ValueError(f"eval.beam={beam} must be at least 1")
    limits = (max_len.tolist() if isinstance(max_len, torch.Tensor)
              else [int(max_len)] * batch_size)
    live: list[list[tuple[float, list[int]]]] = [[(0.0, [])] for _ in range(batch_size)]
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch_size)]
    active = [b for b in range(batch_size) if limits[b] > 0]
    step = 0
    while active:
        step += 1
        rows = [b for b in active for _ in live[b]]
        prefixes = torch.tensor([[bos_id] + tokens for b in active for _, tokens in live[b]],
                                dtype=torch.long, device=device)  # (N, step)
        log_probs = next_log_probs(prefixes, torch.tensor(rows, device=device)).float()  # (N, V)
        start = 0
        for b in active:
            n = len(live[b])
            _expand(b, log_probs[start:start + n], live, finished, beam, eos_id, step,
                    limits[b], length_penalty)
            start += n
        active = [b for b in active
                  if not _done(live[b], finished[b], beam, limits[b], length_penalty)]
    return [max(f, key=lambda item: item[0])[1] if f else [] for f in finished]


def _expand(b: int, log_probs: torch.Tensor, live: list, finished: list, beam: int,
            eos_id: int, step: int, limit: int, alpha: float) -> None:
    """One step of example ``b``: its n live hypotheses' log-probs (n, V) -> new live and
    newly finished hypotheses."""
    scores = torch.tensor([s for s, _ in live[b]], device=log_probs.device)  # (n,)
    totals = (scores[:, None] + log_probs).flatten()  # (n V,)
    k = min(2 * beam, totals.numel())
    best, where = totals.topk(k)
    vocab = log_probs.shape[1]
    penalty = length_penalty_of(step, alpha)
    kept: list[tuple[float, list[int]]] = []
    for rank, (score, flat) in enumerate(zip(best.tolist(), where.tolist())):
        tokens = live[b][flat // vocab][1]
        token = flat % vocab
        if token == eos_id:
            if rank < beam:  # an eos below the best `beam` candidates is not a finished one
                finished[b].append((score / penalty, tokens))
        elif len(kept) < beam:
            kept.append((score, tokens + [token]))
    if step >= limit:  # out of length: finished as they are
        finished[b].extend((score / penalty, tokens) for score, tokens in kept)
        kept = []
    live[b] = kept


def _done(live: list, finished: list, beam: int, limit: int, alpha: float) -> bool:
    if not live or len(finished) >= beam:
        return True
    if not finished:
        return False
    best_possible = max(s for s, _ in live) / length_penalty_of(limit, alpha)
    return max(s for s, _ in finished) >= best_possible
