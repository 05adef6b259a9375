"""Greedy decoding, vectorised: at each step every live prefix takes its most likely next token
(Vaswani et al. 2017 validate WMT this way; the test set gets beam search).  It is
:func:`~xformer_bench.models.beam_search.beam_search` at ``beam == 1`` -- the argmax chain, an
example finished at its eos or at its ``max_len`` (eos counting as a generated token), the
length penalty moot with one hypothesis -- computed on whole tensors: one argmax a step for
the batch, and no per-example bookkeeping on the host.  The beam search's per-example Python
loop made WMT's greedy validation 1.3 s a batch of 64 on a CPU (``results/bench/validation.md``).

The output equals ``beam_search(..., beam=1)`` token for token (tests/test_beam_search.py),
``reorder`` included: it is called before a step only when an example stopped at the one
before, with the rows that go on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from xformer_bench.models.beam_search import NextLogProbs


def greedy_search(next_log_probs: NextLogProbs, batch_size: int, *, bos_id: int, eos_id: int,
                  max_len: int | torch.Tensor, device: torch.device | None = None,
                  reorder: Callable[[torch.Tensor], None] | None = None) -> list[list[int]]:
    """Each example's argmax chain without bos and the final eos; ``max_len`` (int or
    (batch_size,)) the most tokens generated per example, eos included."""
    limits = torch.as_tensor(max_len, device=device).expand(batch_size)  # (B,)
    most = int(limits.max()) if batch_size else 0
    generated = torch.full((batch_size, max(most, 1)), eos_id, dtype=torch.long, device=device)
    lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # tokens kept, eos not
    empty = torch.zeros(batch_size, dtype=torch.bool, device=device)  # nothing finished (-inf)
    active = torch.arange(batch_size, device=device)[limits > 0]  # (N,) examples still live
    prefixes = torch.full((len(active), 1), bos_id, dtype=torch.long, device=device)  # (N, t)
    kept = None
    step = 0
    while len(active):
        step += 1
        if kept is not None and reorder is not None:
            reorder(kept.nonzero()[:, 0])
        log_probs = next_log_probs(prefixes, active).float()  # (N, V)
        best, token = log_probs.max(dim=-1)  # (N,) each
        impossible = best == float("-inf")  # every token of probability zero: no hypothesis
        stops = (token == eos_id) | impossible  # finished here, the token not kept
        cut = ~stops & (step >= limits[active])  # out of length: finished with the token
        generated[active[~stops], step - 1] = token[~stops]
        lengths[active[~stops]] = step
        empty[active[impossible]] = True
        go_on = ~(stops | cut)
        kept = None if bool(go_on.all()) else go_on
        active = active[go_on]
        prefixes = torch.cat([prefixes[go_on], token[go_on, None]], dim=1)
    rows = generated.tolist()
    return [[] if empty[b] else rows[b][:lengths[b]] for b in range(batch_size)]


__all__ = ["greedy_search"]
