"""Autoregressive language modelling over a vocabulary of units (bytes of text, pixel values).

Loss is the mean next-unit cross-entropy in nats, as the model's output head computes it
(:mod:`xformer_bench.heads`: the task never builds the (B, T, V) distribution itself); the
metric is that mean over the evaluated units divided by ln 2, named by the data's unit (:data:`~xformer_bench.metric_spec.BITS_PER`: ``bpb`` for bytes,
``bits_per_dim`` for image dimensions).  Validation and test accumulate the summed nats and the
unit count over the whole split (across ranks) before dividing, so padding never dilutes them.
A model with memory across batches (``stack=recurrent``) forgets it when training starts and
when each validation / test epoch starts, so every evaluation stream starts clean (how the
streams run is the data's: :func:`xformer_bench.run._stream_if_remembered`).

Data that declares ``scores_accuracy`` (MQAR, :mod:`xformer_bench.data.mqar`) is scored first
by :data:`~xformer_bench.metric_spec.ACCURACY`: the fraction of scored positions whose most
likely token is the target (Zoology's recall accuracy).  Data that scores at most n targets
an example (``scored_per_example``: MQAR's queries) is trained and evaluated with the output
head at those columns only (:func:`~xformer_bench.targets.scored_columns`): the same loss, for
n of T positions' V-way softmax.  The record also carries each layer's state size
(``state_bytes``, :mod:`xformer_bench.models.state_size`), the x-axis of the recall plot.
"""

from __future__ import annotations

import math
import lightning as L
import torch

from torchmetrics import SumMetric

from xformer_bench.models.build import build_model
from xformer_bench.models.state_size import layer_state_bytes
from xformer_bench.targets import IGNORE_INDEX, scored_columns
from xformer_bench.tasks import TASK
from xformer_bench.metric_spec import ACCURACY, bits_metric
from xformer_bench.tasks.base import Task

LN2 = math.log(2.0)


def bits_per_unit(nats_sum: torch.Tensor, n_units: torch.Tensor) -> torch.Tensor:
    return nats_sum / n_units / LN2


class LanguageModelTask(Task):
    def __init__(self, model: torch.nn.Module, optim: dict, max_steps: int,
                 unit: str = "bytes", accuracy: bool = False,
                 scored_per_example: int | None = None):
        super().__init__(model, optim, max_steps)
        self.unit = unit
        self.scored_per_example = scored_per_example
        self.bits = bits_metric(unit)
        self.accuracy = accuracy
        self.metrics = (ACCURACY, self.bits) if accuracy else (self.bits,)
        self.eval_correct = SumMetric()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        return self.model(tokens)

    def _nats(self, batch, reduction: str) -> torch.Tensor:
        inputs, targets = batch  # (B, T) each
        if self.scored_per_example is None:
            return self.model(inputs, targets, ignore_index=IGNORE_INDEX, reduction=reduction)
        hidden, targets = self._at_scored(inputs, targets)  # (B, n, D), (B, n)
        return self.model.head.loss(hidden, targets, ignore_index=IGNORE_INDEX,
                                    reduction=reduction)

    def _at_scored(self, inputs: torch.Tensor,
                   targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The final states and targets of the scored columns only (``scored_per_example``)."""
        hidden = self.model.hidden(inputs)  # (B, T, D)
        columns = scored_columns(targets, self.scored_per_example)  # (B, n)
        picked = hidden.gather(1, columns[..., None].expand(-1, -1, hidden.shape[-1]))
        return picked, targets.gather(1, columns)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        nats = self._nats(batch, "mean")
        return self.training_loss(nats, **{self.bits.name: nats / LN2})

    def _eval_step(self, batch, split: str) -> None:
        if self.accuracy:
            return self._scored_step(batch)
        self.eval_nats.update(self._nats(batch, "sum"))
        self.eval_count.update((batch[1] != IGNORE_INDEX).sum())

    def _scored_step(self, batch) -> None:
        """Nats and correct predictions at the scored positions, the head applied there only
        (at the ``scored_per_example`` columns, or the boolean selection without them)."""
        inputs, targets = batch  # (B, T) each
        if self.scored_per_example is None:
            scored = targets != IGNORE_INDEX  # (B, T)
            hidden, answers = self.model.hidden(inputs)[scored][None], targets[scored][None]
        else:
            hidden, answers = self._at_scored(inputs, targets)  # (B, n, D), (B, n)
        log_probs = self.model.head(hidden).float()  # (B | 1, n, V)
        kept = answers != IGNORE_INDEX
        nats = -log_probs.gather(-1, answers.clamp(min=0)[..., None])[..., 0]
        self.eval_nats.update(nats[kept].sum())
        self.eval_count.update(kept.sum())
        self.eval_correct.update((log_probs.argmax(-1) == answers)[kept].sum())

    def _eval_end(self, split: str) -> None:
        nats, n = self._split_loss(split)
        bar = split == "val"
        if self.accuracy:
            correct = self.eval_correct.compute()
            self.eval_correct.reset()
            self.log(ACCURACY.key(split), correct / n, prog_bar=bar, sync_dist=False)
        self.log(self.bits.key(split), bits_per_unit(nats, n), prog_bar=bar and not self.accuracy,
                 sync_dist=False)

    def record_fields(self) -> dict:
        """What the run record adds: each layer's state size at the data's length
        (:func:`~xformer_bench.models.state_size.layer_state_bytes`, float32), and their mean;
        None when a mixer fails to say (read as the run ends, whatever its outcome)."""
        try:
            layers = layer_state_bytes(self.model, self.model.dims.seq_len)
        except Exception:  # noqa: BLE001 -- never mask the run's own outcome
            return {"state_bytes": None}
        known = [b for b in layers if b is not None]
        mean = sum(known) / len(known) if known and len(known) == len(layers) else None
        return {"state_bytes": {"layers": layers, "per_layer": mean,
                                "seq_len": self.model.dims.seq_len, "dtype": "float32"}}

    def _reset_memory(self, training: bool | None) -> None:
        if hasattr(self.model, "reset_memory"):
            self.model.reset_memory(training)

    def on_train_start(self) -> None:
        self._reset_memory(None)

    def on_validation_epoch_start(self) -> None:
        self._reset_memory(False)  # the training streams' memory stays for the next step

    def on_test_epoch_start(self) -> None:
        self._reset_memory(False)


@TASK.register("lm")
def build(config: dict, datamodule: L.LightningDataModule) -> LanguageModelTask:
    """The model the config describes over the data's vocabulary, scored per the data's unit.
    Data with a layout (images: height, width, channels) gives a per-axis position scheme
    (``factorized``, ``axial``) its grid where ``position.shape`` is left null."""
    layout = getattr(datamodule, "layout", None)
    if layout is not None and "shape" in config["position"] and config["position"]["shape"] is None:
        config = {**config, "position": {**config["position"], "shape": list(layout)}}
    model = build_model(config, datamodule.vocab_size)
    return LanguageModelTask(model, config["optim"], max_steps=config["trainer"]["max_steps"],
                             unit=datamodule.unit,
                             accuracy=getattr(datamodule, "scores_accuracy", False),
                             scored_per_example=getattr(datamodule, "scored_per_example", None))
