"""Adaptive Computation Time bookkeeping (Graves 2016), position-wise, as the Universal
Transformer runs it (Dehghani et al. 2019, Appendix C; tensor2tensor's ``ut_act``).

Per position t and step n the halting unit gives h_t^n in (0, 1).  With ``threshold`` = 1 - eps:

* the position halts at the first step N whose h_t^1 + ... + h_t^N exceeds the threshold
  (strictly, as the UT listing's ``tf.greater``), or at ``max_depth`` (Graves' cap M);
* its remainder is R = 1 - (h_t^1 + ... + h_t^{N-1});
* the step weights are h_t^n for n < N, R at N and 0 after, so they sum to 1 exactly;
* the ponder cost is rho = N + R (Graves eq. 11; ``ponder_times + remainders`` in UT).

Difference from the UT listing: at ``max_depth`` the listing stops the loop without giving a
still-running position its remainder, so its weights need not sum to 1; here the last step
always halts every running position with its remainder, as Graves' N(t) = min(M, ...) does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Halting:
    """The running ACT state of every position, each a (B, T) tensor."""

    cumulative: torch.Tensor  # sum of the weights given so far (1 once halted)
    remainder: torch.Tensor  # R, set at the halting step, 0 before
    steps: torch.Tensor  # N, steps taken so far (float, no gradient)
    halted: torch.Tensor  # bool

    @classmethod
    def start(cls, like: torch.Tensor) -> Halting:
        """Nothing halted, no step taken, for positions shaped like ``like`` (B, T)."""
        zeros = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
        return cls(zeros, zeros.clone(), zeros.clone(), torch.zeros_like(zeros, dtype=torch.bool))

    def update(self, p: torch.Tensor, threshold: float, final: bool) -> torch.Tensor:
        """Take one step with halting probabilities ``p`` (B, T); returns the step's weights
        (B, T): p for positions still running after it, R for those halting now, 0 for those
        halted before.  ``final``: the last allowed step, where every running position halts."""
        running = ~self.halted  # (B, T) positions this step updates
        newly_halted = running if final else running & (self.cumulative + p > threshold)
        still_running = running & ~newly_halted
        remainder = 1.0 - self.cumulative  # (B, T), carries the gradient of the earlier p
        zero = torch.zeros_like(p)
        weight = torch.where(still_running, p, torch.where(newly_halted, remainder, zero))
        self.remainder = torch.where(newly_halted, remainder, self.remainder)
        self.cumulative = self.cumulative + weight
        self.steps = self.steps + running.float()
        self.halted = self.halted | newly_halted
        return weight

    def ponder(self) -> torch.Tensor:
        """rho = N + R per position (B, T); its gradient flows through R only."""
        return self.steps + self.remainder
