"""Equal compute instead of equal steps: a study declares ``equal_compute: {tokens: N}`` or
``{flops: F}`` and each row's ``trainer.max_steps`` is derived from that budget before the run
is built (right after :func:`~xformer_bench.models.param_match.match_params`, since d_ff changes
a step's FLOPs):

- ``tokens``: ``max_steps = floor(N / (data.batch_size * data.seq_len *
  trainer.accumulate_grad_batches))``;
- ``flops``: ``max_steps = floor(F / flops_per_step)``, the analytic forward + backward FLOPs of
  one training step (:func:`~xformer_bench.models.flops.training_step_flops`, the count the
  record's ``flops_per_step`` holds, on one process), the model built on the meta device.

``equal_compute`` itself is outside the run's identity: the derived ``trainer.max_steps`` is
what the run computes, and it is in the id.  The derivation is stored in
``config["equal_compute"]["result"]`` (the record keeps the config), and the table says so
(:func:`equal_compute_sentence`).  A derived ``max_steps`` below 1, a budget that is neither
``tokens`` nor ``flops``, and an explicit ``trainer.max_steps=`` on the command line beside
it are refused (ConfigError, one line).
"""

from __future__ import annotations

import copy
from typing import Any

from xformer_bench.errors import ConfigError, XbenchError

BUDGETS = ("tokens", "flops")


def _budget(request: Any) -> tuple[str, float]:
    if not isinstance(request, dict) or len(request.keys() - {"result"}) != 1:
        raise ConfigError("equal_compute takes one budget: equal_compute={tokens: N} or "
                          "equal_compute={flops: F}")
    (kind,) = request.keys() - {"result"}
    value = request[kind]
    if kind not in BUDGETS or isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not value > 0:
        raise ConfigError(f"equal_compute.{kind}={value}: the budget is tokens or flops, a "
                          "positive number (equal_compute={tokens: N} or {flops: F})")
    return kind, value


def _sets_max_steps(overrides: list[str]) -> bool:
    return any(o.split("=", 1)[0].lstrip("+~") == "trainer.max_steps" for o in overrides)


def tokens_per_step(config: dict[str, Any]) -> int:
    """Training tokens of one optimiser step: batch_size * seq_len * accumulate_grad_batches."""
    return (config["data"]["batch_size"] * config["data"]["seq_len"]
            * config["trainer"]["accumulate_grad_batches"])


def step_flops(config: dict[str, Any]) -> int:
    """FLOPs of one training step of the model ``config`` builds (forward + backward, the
    accumulated batches; one process), as the run's record counts ``flops_per_step``: built on
    the meta device (on the CPU where construction reads a tensor's value).  The vocabulary is
    the data option's own where its class declares one, else param_match's nominal one."""
    import torch

    from xformer_bench.models.build import build_model
    from xformer_bench.models.flops import training_step_flops
    from xformer_bench.models.param_match import NOMINAL_VOCAB
    from xformer_bench.registry import DATA

    try:
        vocab = getattr(DATA.get(config["data"]["name"]), "vocab_size", None)
    except XbenchError:
        vocab = None
    vocab = vocab if isinstance(vocab, int) else NOMINAL_VOCAB
    data = config["data"]

    def count() -> int:
        model = build_model(config, vocab)
        probe = getattr(model, "example_inputs", None)
        flops = training_step_flops(model, data["seq_len"], data["batch_size"],
                                    probe(1) if probe else None)
        return flops.scaled(config["trainer"]["accumulate_grad_batches"]).total

    try:
        with torch.device("meta"):
            return count()
    except XbenchError:
        raise
    except (RuntimeError, NotImplementedError):  # construction read a meta tensor's value
        return count()


def apply_equal_compute(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``config`` with ``trainer.max_steps`` derived from its ``equal_compute`` budget and the
    derivation in ``equal_compute.result`` (a copy), or ``config`` itself when none is set."""
    request = config.get("equal_compute")
    if not request:
        return config
    kind, budget = _budget(request)
    if _sets_max_steps(overrides):
        raise ConfigError(f"equal_compute={{{kind}: {budget:g}}} derives trainer.max_steps: "
                          "remove trainer.max_steps= from the command line (or equal_compute)")
    per_step = tokens_per_step(config) if kind == "tokens" else step_flops(config)
    steps = int(budget // per_step)
    if steps < 1:
        raise ConfigError(f"equal_compute.{kind}={budget:g} is less than one training step "
                          f"({per_step:,} {kind} per step): trainer.max_steps would be {steps}")
    derived = copy.deepcopy(config)
    derived["trainer"]["max_steps"] = steps
    derived["equal_compute"] = {kind: budget, "result": {
        "max_steps": steps, f"{kind}_per_step": per_step}}
    return derived
