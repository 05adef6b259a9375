"""Efficiency through the training step, against its Amdahl bound.

A kernel that is fast alone can still leave the training step slow (gathers, masks, casts
around it).  For each attention option and length T this times the whole training step of a
small model (``model.d_model`` 256, 2 layers, 4 heads, batch 1 by default) three ways, in the
hand-written loop of :mod:`.train_race` (forward, cross-entropy, backward, clipping, AdamW):

* ``t_full`` -- with full attention (``attention=full``, on CPU the fused SDPA kernel);
* ``t_option`` -- with the option at its YAML defaults;
* ``t_free`` -- full attention's model with every attention kernel replaced by one that returns
  its values unchanged (:class:`FreeKernel`): projections, norms and feed-forward kept, the
  attention itself removed -- the fastest any attention could make this step.

An option that attends a fraction ``a`` of the causal (query, key) pairs (probed once, the
record's ``attention_coverage``) still pays for them: a kernel scoring exactly its pairs at full
attention's cost per pair would reach a share ``1 - a`` of the bound, the table's ceiling.

The bound speed-up is ``t_full / t_free``; the option's ``t_full / t_option``; the share of
the bound it reaches is ``(t_full - t_option) / (t_full - t_free)``: the fraction of full
attention's own time that the option saves (1 = free, 0 = no faster than full, negative =
slower).  Each time is the fastest of the timed steps (the machine's noise only slows a
step).  Each step's peak memory (the allocation tracker) is reported beside full's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from xformer_bench.bench.train_race import hand_loop


class FreeKernel(nn.Module):
    """An attention kernel that costs nothing: its output is its values."""

    def forward(self, q, k, v, **_):  # (B, H, T, Dh) -> (B, H, T, Dh)
        return v


@dataclass(frozen=True)
class StepShape:
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 4
    batch: int = 1

    def size(self, length: int) -> dict:
        return dict(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                    d_ff=4 * self.d_model, seq_len=length, batch=self.batch)


def build(attention: str, length: int, shape: StepShape, free: bool = False,
          overrides: tuple[str, ...] = ()) -> nn.Module:
    from xformer_bench.config import compose_config
    from xformer_bench.models.build import build_model

    size = shape.size(length)
    config = compose_config(f"attention={attention}", f"model.d_model={size['d_model']}",
                            f"model.n_layers={size['n_layers']}",
                            f"model.n_heads={size['n_heads']}", f"model.d_ff={size['d_ff']}",
                            f"data.seq_len={length}", f"data.batch_size={size['batch']}",
                            *overrides)
    torch.manual_seed(0)
    model = build_model(config, vocab_size=256)
    if free:
        replaced = 0
        for module in model.modules():
            if hasattr(module, "kernel") and isinstance(module.kernel, nn.Module):
                module.kernel, replaced = FreeKernel(), replaced + 1
        if replaced != shape.n_layers:
            raise RuntimeError(f"replaced {replaced} attention kernels, expected {shape.n_layers}")
    return model


@dataclass
class StepPoint:
    attention: str
    length: int
    seconds: float       # one training step
    peak_mb: float       # its allocation-tracker peak
    attended: float | None = None  # fraction of the causal pairs its first layer attends


def attended_fraction(model: nn.Module, length: int) -> float | None:
    """The fraction of causal (query, key) pairs the model's first attention layer attends at
    ``length``: counted on the kernel's mask where it declares its pattern (``flex_pattern``),
    else probed (:func:`~xformer_bench.models.attended_pairs.attention_coverage`; None where it
    cannot be)."""
    from xformer_bench.attention._ops.flex import dense_mask
    from xformer_bench.models.attended_pairs import attention_coverage, first_token_mixer

    mixer = first_token_mixer(model)
    kernel = getattr(mixer, "kernel", None)
    if hasattr(kernel, "flex_pattern"):
        pattern = kernel.flex_pattern(length, length, True, 0, mixer.n_heads)
        heads = pattern.heads or 1  # 0: the same pairs in every head
        mask = dense_mask(pattern, length, length, True, heads)
        return float(mask.sum()) / (heads * length * (length + 1) / 2)
    return attention_coverage(mixer, length, [0], causal=True)["attended_fraction"]


def time_steps(models: dict[str, nn.Module], length: int, shape: StepShape, steps: int
               ) -> list[StepPoint]:
    """Each model's fastest of ``steps`` single training steps, taken round-robin (one step of
    each model in turn, after a warm-up round), so a slow phase of a shared machine falls on
    every row alike rather than on whichever row it ran in; then its step memory."""
    from xformer_bench.training.step_memory import training_step_memory

    size = shape.size(length)
    best = dict.fromkeys(models, 0.0)
    for round_ in range(steps + 1):
        for key, model in models.items():
            rate = hand_loop(model, size, 1, warmup=0, device="cpu", precision="32-true")[0]
            if round_:  # round 0 warms every model up
                best[key] = max(best[key], rate)
    return [StepPoint(key, length, size["batch"] * length / best[key],
                      training_step_memory(model, length, size["batch"], 256),
                      {"free": None, "full": 1.0}.get(key) if key in ("free", "full")
                      else attended_fraction(model, length))
            for key, model in models.items()]


def share_of_bound(full: StepPoint, option: StepPoint, free: StepPoint) -> float:
    """(t_full - t_option) / (t_full - t_free): the share of full attention's time saved."""
    return (full.seconds - option.seconds) / (full.seconds - free.seconds)


def markdown(points: list[StepPoint], where: str) -> str:
    """A row per (option, length): step time, speed-up over full, the bound's speed-up, the
    share of the bound reached beside its ceiling (1 - the attended fraction), peak memory and
    its ratio to full's."""
    at = {(p.attention, p.length): p for p in points}
    lines = [f"The training step against its Amdahl bound ({where}); share of the bound = "
             "(t_full - t_option) / (t_full - t_free); ceiling = 1 - attended, the share of a "
             "kernel that scores exactly the pairs it attends at full's cost per pair", "",
             "| attention | T | s / step | speed-up | bound | attended | share of bound "
             "(ceiling) | step MiB | memory vs full |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    order = {name: i for i, name in reversed(list(enumerate(p.attention for p in points)))}
    for p in sorted(points, key=lambda p: (order[p.attention], p.length)):  # option by option
        if p.attention in ("full", "free"):
            continue
        full, free = at[("full", p.length)], at[("free", p.length)]
        lines.append(f"| {p.attention} | {p.length} | {p.seconds:.3f} | "
                     f"{full.seconds / p.seconds:.2f}x | {full.seconds / free.seconds:.2f}x | "
                     f"{_percent(p.attended)} | {100 * share_of_bound(full, p, free):.0f} % "
                     f"({_percent(None if p.attended is None else 1 - p.attended)}) | "
                     f"{p.peak_mb:.0f} | {p.peak_mb / full.peak_mb:.2f}x |")
    for length in sorted({p.length for p in points}):
        full, free = at[("full", length)], at[("free", length)]
        lines.append(f"| full (free) | {length} | {full.seconds:.3f} ({free.seconds:.3f}) | "
                     f"1.00x | {full.seconds / free.seconds:.2f}x | 100 % | 0 % (0 %) | "
                     f"{full.peak_mb:.0f} | 1.00x |")
    return "\n".join(lines) + "\n"


def _percent(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.0f} %"


def sweep(names: list[str], lengths: list[int], shape: StepShape, steps: int,
          progress=print) -> list[StepPoint]:
    """Full, the free bound and every option at each length, timed round-robin
    (:func:`time_steps`); an option the decoder LM refuses (bidirectional-only) is skipped
    with a line."""
    from xformer_bench.errors import ConfigError

    points = []
    for length in lengths:
        models = {"full": build("full", length, shape), "free": build("full", length, shape, True)}
        for name in (n for n in names if n != "full"):
            try:
                models[name] = build(name, length, shape)
            except ConfigError as error:
                progress(f"skip {name}: {error}")
        timed = time_steps(models, length, shape, steps)
        progress(" ".join(f"{p.attention} T={length}: {p.seconds:.3f} s/step" for p in timed))
        points += timed
    return points
