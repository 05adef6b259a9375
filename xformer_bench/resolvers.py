"""OmegaConf resolvers the configs use, registered once when :mod:`xformer_bench.config` is
imported (before any composition: the CLI, the preflight check and the tests all import it).

``${vaswani_lr:D,W}`` -- the peak of Vaswani et al.'s (2017, eq. 3) learning rate,
``lrate = D^-0.5 * min(step^-0.5, step * W^-1.5)``, reached at step W: ``D^-0.5 * W^-0.5``.
With ``optim.decay=inverse_sqrt`` and ``optim.warmup_steps=W`` the house schedule
(:func:`xformer_bench.tasks.schedule.lr_factor`: linear warm-up to the peak, then
``sqrt(W / step)``) is that formula exactly, step for step (steps counted from 1).
"""

from __future__ import annotations

from omegaconf import OmegaConf


def vaswani_lr(d_model: int, warmup_steps: int) -> float:
    """The peak learning rate of Vaswani et al. (2017) eq. 3 for model width ``d_model`` and
    ``warmup_steps`` steps of warm-up; a size that is not positive gives 0 (the optimiser's
    check then names ``optim.lr``)."""
    if d_model <= 0 or warmup_steps <= 0:
        return 0.0
    return float(d_model) ** -0.5 * float(warmup_steps) ** -0.5


RESOLVERS = {"vaswani_lr": vaswani_lr}


def register() -> None:
    """Register :data:`RESOLVERS` with OmegaConf (again is a no-op)."""
    for name, function in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)
