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
likely token is the target (Zoology's recall accuracy), evaluated -- like their nats -- from
the head at the scored positions only.  The record also carries each layer's state size
(``state_bytes``, :mod:`xformer_bench.models.state_size`), the x-axis of the recall plot.
"""

from __future__ import annotations

import math
import lightning as L
import torch

from torchmetrics import SumMetric

from xformer_bench.models.build import build_model
from xformer_bench.models.state_size import layer_state_bytes
from xformer_bench.targets import IGNORE_INDEX
from xformer_bench.tasks import TASK
from xformer_bench.metric_spec import ACCURACY, bits_metric
from xformer_bench.tasks.base import Task

LN2 = math.log(2.0)


def bits_per_unit(nats_sum: torch.Tensor, n_units: torch.Tensor) -> torch.Tensor:
    return nats_sum / n_units / LN2


class LanguageModelTask(Task):
    def __init__(self, model: torch.nn.Module, optim: dict, max_steps: int,
                 unit: str = "bytes", accuracy: bool = False):
        super().__init__(model, optim, max_steps)
        self.unit = unit
        self.bits = bits_metric(unit)
        self.accuracy = accuracy
        self.metrics = (ACCURACY, self.bits) if accuracy else (self.bits,)
        self.eval_correct = SumMetric()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        return self.model(tokens)

    def _nats(self, batch, reduction: str) -> torch.Tensor:
        inputs, targets = batch  # (B, T) each
        return self.model(inputs, targets, ignore_index=IGNORE_INDEX, reduction=reduction)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        nats = self._nats(batch, "mean")
        return self.training_loss(nats, **{self.bits.name: nats / LN2})

    def _eval_step(self, batch, split: str) -> None:
        if self.accuracy:
            return self._scored_step(batch)
        self.eval_nats.update(self._nats(batch, "sum"))
        self.eval_count.update((batch[1] != IGNORE_INDEX).sum())

    def _scored_step(self, batch) -> None:
        """Nats and correct predictions at the scored positions, the head applied there only."""
        inputs, targets = batch  # (B, T) each
        scored = targets != IGNORE_INDEX  # (B, T)
        answers = targets[scored]  # (N,)
        log_probs = self.model.head(self.model.hidden(inputs)[scored][None])[0].float()  # (N, V)
        self.eval_nats.update(-log_probs.gather(-1, answers[:, None]).sum())
        self.eval_count.update(scored.sum())
        self.eval_correct.update((log_probs.argmax(-1) == answers).sum())

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
                             accuracy=getattr(datamodule, "scores_accuracy", False))
