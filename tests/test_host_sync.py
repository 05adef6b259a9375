"""No host synchronisation in a training step.

On a GPU, ``.item()``, ``bool(t)``, ``.tolist()``, ``.cpu()``, ``nonzero``, boolean-mask
indexing and other data-dependent shapes make the host wait for the device every step.  They
are caught here on a CPU, at the ATen level (:mod:`host_syncs`), through one whole training
step -- forward, loss, backward, the project's optimiser (``adamw_with_schedule``, as it runs
on a GPU: fused), ``prepare_training_step`` and ``apply_pending_updates`` as the Task calls them -- of the
default model and of a model with each attention option (causal), each option's layer in
bidirectional mode (with and without key padding) where it provides it, and of the training
path itself: ``Task.training_step`` and the optimiser step in Lightning's loop, with its
per-step callbacks and logging.  Each case is stepped once before the recorded step, so
what is built once and cached (index tensors per length) does not count.

A sync that must stay is declared, with its reason, in
:data:`references.DECLARED_HOST_SYNCS`; any other fails the test, naming the op and the
innermost ``xformer_bench`` source line that caused it."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from conftest import SMALL_DIMS, TINY_RUN, compose_config, seeded_model, seeded_tokens
from host_syncs import location, recording_host_syncs, summary
from references import BOUNDARY_KWARGS, DECLARED_HOST_SYNCS
from test_attention_zoo import OPTIONS, mixer
from xformer_bench.config import CONF_DIR
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.step_updates import apply_pending_updates, prepare_training_step
from xformer_bench.position import Position
from xformer_bench.tasks.optimization import adamw_with_schedule

OPTIM = compose_config()["optim"]


def as_on_a_gpu(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimiser as ``adamw_with_schedule`` builds it on a GPU (``fused``: its step count
    lives on the device).  On a CPU it picks the for-loop AdamW, whose step count is a CPU
    tensor read with ``.item()`` -- host memory there, no device to wait for."""
    for group in optimizer.param_groups:
        group["fused"] = True
    return optimizer


def recorded_step(module: torch.nn.Module, loss) -> list[tuple[str, str]]:
    """Host syncs of the second of two training steps of ``module`` (``loss()`` -> scalar):
    forward and loss, backward, AdamW under the house schedule, the pending updates."""
    built = adamw_with_schedule(module, OPTIM, max_steps=10)
    optimizer, scheduler = as_on_a_gpu(built["optimizer"]), built["lr_scheduler"]["scheduler"]

    def step():
        prepare_training_step(module)  # as Task.on_train_batch_start: Performer's redraw
        loss().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        apply_pending_updates(module)

    step()  # what a module builds once (and caches) is not a per-step sync
    with recording_host_syncs() as syncs:
        step()
    return syncs


def model_step(*overrides: str, length: int = 16) -> list[tuple[str, str]]:
    """A language model's training step: next-token cross-entropy plus its auxiliary losses."""
    dims = [o for o in SMALL_DIMS if not o.startswith("data.seq_len=")]
    model = seeded_model(*dims, f"data.seq_len={length}", *overrides).train()
    tokens = seeded_tokens(length=length + 1)

    def loss():
        logits = model(tokens[:, :-1])
        nats = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        auxiliary = model.auxiliary_loss()
        return nats if auxiliary is None else nats + auxiliary

    return recorded_step(model, loss)


def layer_step(name: str, padded: bool, length: int = 16, **settings) -> list[tuple[str, str]]:
    """The option's layer in bidirectional mode (an encoder's, a classifier's), optionally with
    key padding on the second row."""
    layer = mixer(name, seq_len=length, **settings).train()
    x = torch.randn(2, length, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    padding = None
    if padded:
        padding = torch.zeros(2, length, dtype=torch.bool)
        padding[1, length - 5:] = True

    def loss():
        ctx = ForwardContext(Position(), causal=False, layer=1, key_padding_mask=padding)
        return layer(x, ctx).square().mean()

    return recorded_step(layer, loss)


def undeclared(key: str, syncs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The ``syncs`` that :data:`DECLARED_HOST_SYNCS` does not declare for ``key``."""
    declared = DECLARED_HOST_SYNCS.get(key, {})
    return [(op, at) for op, at in syncs if location(at) not in declared]


def assert_no_undeclared(case: str, syncs: list[tuple[str, str]], declared_as: str = "") -> None:
    offenders = undeclared(declared_as or case, syncs)
    assert not offenders, f"{case}: host syncs in a training step (declare them in " \
        "references.DECLARED_HOST_SYNCS with the reason, or remove them):\n  " + \
        "\n  ".join(summary(offenders))


# ------------------------------------------------------------------ models and layers


def test_the_default_model_trains_without_a_host_sync():
    assert compose_config()["model"]["name"] == "vanilla"
    assert_no_undeclared("model=vanilla", model_step())


BOUNDARY_LENGTH = 18
"""The length of the steps at an option's BOUNDARY_KWARGS (4 to 6 windows, blocks, chunks or
clusters; not a multiple of 4, so segments, blocks and chunks come out uneven)."""


def _cases(name: str) -> list[tuple[str, list]]:
    """(case, host syncs) for each way the option trains: its causal model, its bidirectional
    layer with and without padding; at its YAML defaults (T = 16) and at BOUNDARY_KWARGS."""
    settings = [("defaults", 16, {})]
    if name in BOUNDARY_KWARGS:
        settings.append(("boundaries", BOUNDARY_LENGTH, BOUNDARY_KWARGS[name]))
    cases = []
    for label, length, kwargs in settings:
        provides = mixer(name, seq_len=length, **kwargs).provides
        if "causal" in provides:
            overrides = [f"attention.{key}={value}" for key, value in kwargs.items()]
            cases.append((f"causal model, {label}",
                          model_step(f"attention={name}", *overrides, length=length)))
        if "bidirectional" in provides:
            for padded in (False, True)[:1 + ("key_padding_mask" in provides)]:
                cases.append((f"bidirectional layer{', padded' if padded else ''}, {label}",
                              layer_step(name, padded, length, **kwargs)))
    return cases


@pytest.mark.parametrize("name", OPTIONS)
def test_every_attention_option_trains_without_an_undeclared_host_sync(name):
    key = f"attention={name}"
    cases = _cases(name)
    assert cases, f"{key} provides neither causal nor bidirectional attention"
    for case, syncs in cases:
        assert_no_undeclared(f"{key} ({case})", syncs, declared_as=key)
    met = {location(at) for _, syncs in cases for _, at in syncs}
    stale = set(DECLARED_HOST_SYNCS.get(key, {})) - met
    assert not stale, f"{key}: declared host syncs no step makes any more: {sorted(stale)}"


PART_OPTIONS = [(group, path.stem) for group in ("stack", "ffn", "norm", "position", "activation")
                for path in sorted((CONF_DIR / group).glob("*.yaml"))]


@pytest.mark.parametrize("group,name", PART_OPTIONS, ids=[f"{g}={n}" for g, n in PART_OPTIONS])
def test_every_other_part_trains_without_an_undeclared_host_sync(group, name):
    """Stacks (the Universal Transformer's halting), feed-forward layers (routed experts),
    norms, positions and activations, each in the default model."""
    key = f"{group}={name}"
    syncs = model_step(key)
    assert_no_undeclared(key, syncs)
    stale = set(DECLARED_HOST_SYNCS.get(key, {})) - {location(at) for _, at in syncs}
    assert not stale, f"{key}: declared host syncs no step makes any more: {sorted(stale)}"


# ------------------------------------------------------------------ the check itself


class Planted(torch.nn.Module):
    """A module that branches on its data: ``if x.sum() > 0`` reads a device value."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def test_the_check_catches_a_planted_data_dependent_branch():
    model = seeded_model(*SMALL_DIMS)
    model.planted = Planted()  # after the first block's feed-forward, in every step
    model.stack.blocks[0].feedforward.register_forward_hook(
        lambda module, inputs, out: model.planted(out))
    tokens = seeded_tokens(length=17)
    syncs = recorded_step(model, lambda: F.cross_entropy(
        model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()))
    assert [(op, location(at)) for op, at in undeclared("model=vanilla", syncs)] == \
        [("item", "tests/test_host_sync.py:forward")]
    with pytest.raises(AssertionError, match=r"item at tests/test_host_sync.py:\d+ forward"):
        assert_no_undeclared("model=vanilla", syncs)


@pytest.mark.parametrize(("construct", "op"), [
    (lambda x, m: x.sum().item(), "item"),
    (lambda x, m: x.tolist(), "tolist"),
    (lambda x, m: x.cpu(), "cpu()"),
    (lambda x, m: int(x.argmax()), "item"),
    (lambda x, m: x[m], "boolean-mask indexing"),
    (lambda x, m: m.nonzero(), "nonzero"),
    (lambda x, m: torch.where(m), "nonzero"),
    (lambda x, m: x.masked_select(m), "masked_select"),
    (lambda x, m: torch.unique(m.long()), "unique"),
    (lambda x, m: x.repeat_interleave(m[:, 0].long() + 1, dim=0),
     "repeat_interleave (no output_size)"),
    (lambda x, m: torch.bincount(m.long().flatten()), "bincount"),
])
def test_the_recorder_sees_each_kind_of_host_sync(construct, op):
    x, m = torch.randn(4, 3), torch.randn(4, 3) > 0
    with recording_host_syncs() as syncs:
        construct(x, m)
    assert op in [name for name, _ in syncs]


def test_branch_free_forms_are_not_host_syncs():
    x, m = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3) > 0
    with recording_host_syncs() as syncs:
        y = torch.where(m, x, 0.0).masked_fill(~m, 1.0).sort(-1).values
        y = y + x.repeat_interleave(torch.tensor([1, 2, 1, 1]), dim=0, output_size=5)[:4]
        y[torch.arange(4)].sum().backward()
    assert syncs == []


def test_every_declared_sync_names_a_case_and_a_reason():
    cases = ({"model=vanilla", *TRAINING_PATH} | {f"attention={n}" for n in OPTIONS}
             | {f"{group}={name}" for group, name in PART_OPTIONS})
    for key, entries in DECLARED_HOST_SYNCS.items():
        assert key in cases, key
        for where, reason in entries.items():
            assert ":" in where and len(reason) > 40, (key, where)


# ------------------------------------------------------------------ the training path

TRAINING_PATH = ("training", "training:log_step", "training:progress_bar")
"""Cases of the training path: every step, the steps a logger writes, a shown progress bar."""


class RecordSteps(L.Callback):
    """Host syncs of each training step, from the start of one batch to the start of the next
    (the loop's logging and callbacks after the optimiser step included)."""

    def __init__(self):
        self.steps: dict[int, list] = {}
        self._recording = None

    def _stop(self) -> None:
        if self._recording is not None:
            self._recording.__exit__(None, None, None)
            self._recording = None

    def on_train_start(self, trainer, pl_module) -> None:
        as_on_a_gpu(trainer.optimizers[0])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._stop()
        self._recording = recording_host_syncs()
        self.steps[batch_idx] = self._recording.__enter__()

    def on_validation_start(self, trainer, pl_module) -> None:
        self._stop()

    def on_train_end(self, trainer, pl_module) -> None:
        self._stop()


def trained_steps(tmp_path, progress_bar: bool = False) -> dict[int, list]:
    """A tiny run's 6 training steps (the last one ends in validation), written every 2nd step,
    through the trainer and callbacks `xbench` uses; each step's host syncs."""
    from xformer_bench.run import build_task
    from xformer_bench.training.loggers import build_loggers
    from xformer_bench.training.throughput import Throughput
    from xformer_bench.training.trainer import build_trainer
    from xformer_bench.training.validation_history import ValidationHistory

    tiny = [o for o in TINY_RUN if not o.startswith(("logger=", "trainer.progress_bar="))]
    config = compose_config(*tiny, "logger=csv", f"trainer.progress_bar={str(progress_bar).lower()}",
                            "trainer.max_steps=6", "trainer.val_checks=1",
                            "trainer.log_every_n_steps=2")
    L.seed_everything(0, verbose=False)
    datamodule, task = build_task(config)
    recorder = RecordSteps()
    trainer = build_trainer(config["trainer"], build_loggers(config["logger"], tmp_path, {}),
                            [Throughput(128), ValidationHistory(), recorder], tmp_path)
    trainer.fit(task, datamodule=datamodule)
    return recorder.steps


def test_the_training_path_syncs_only_where_declared(tmp_path):
    """Per step: only the divergence check (every step on a CPU; on a GPU every
    ``log_every_n_steps``); on the steps a logger writes, Lightning's conversion of the
    logged values to numbers as well."""
    steps = trained_steps(tmp_path)
    assert sorted(steps) == list(range(6))
    for index in (2, 4):  # neither written nor validated
        assert_no_undeclared("training", steps[index])
    for index in (1, 3):  # global step 2, 4: the logger writes
        syncs = undeclared("training", steps[index])
        assert_no_undeclared("training:log_step", syncs)
        assert syncs, "a written step converts its logged values (declared as such)"


def test_a_shown_progress_bar_syncs_every_step_and_is_declared(tmp_path):
    """The bar shows the step's loss: a per-step sync, off in studies (progress_bar=false)."""
    steps = trained_steps(tmp_path, progress_bar=True)
    syncs = undeclared("training", steps[2])
    assert syncs
    assert_no_undeclared("training:progress_bar", syncs)
