"""Classification (LRA's ListOps and image tasks, ViT / ImageNet): cross-entropy on the class
logits of an encoder; top-1 (and top-5 with more than five classes) accuracy over the whole
split with torchmetrics, accumulated across ranks before dividing, so the last short batch
counts by its examples.  Validation and test also log the mean cross-entropy per example
(``val/loss``).  The metric specs carry the direction: higher is better, shown as a percentage.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from xformer_bench.metric_spec import MetricSpec
from xformer_bench.models.build import build_classifier
from xformer_bench.tasks import TASK
from xformer_bench.tasks.base import Task

TOP1 = MetricSpec("top1", "top-1 %", higher_is_better=True, digits=1, scale=100.0)
TOP5 = MetricSpec("top5", "top-5 %", higher_is_better=True, digits=1, scale=100.0)


class ClassificationTask(Task):
    unit = "examples"

    def __init__(self, model: torch.nn.Module, num_classes: int, optim: dict, max_steps: int):
        super().__init__(model, optim, max_steps)
        self.metrics = (TOP1, TOP5) if num_classes > 5 else (TOP1,)
        self.accuracy = torch.nn.ModuleDict({
            spec.name: MulticlassAccuracy(num_classes, top_k=int(spec.name[3:]), average="micro")
            for spec in self.metrics})

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:  # -> (B, classes) logits
        return self.model(inputs)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        inputs, labels = batch  # (B, ...), (B,)
        logits = self.model(inputs)
        nats = F.cross_entropy(logits.float(), labels)
        return self.training_loss(nats, **{TOP1.name: (logits.argmax(-1) == labels).float().mean()})

    def _eval_step(self, batch, split: str) -> None:
        inputs, labels = batch
        logits = self.model(inputs).float()
        self.eval_nats.update(F.cross_entropy(logits, labels, reduction="sum"))
        self.eval_count.update(torch.tensor(float(len(labels)), device=labels.device))
        for metric in self.accuracy.values():
            metric.update(logits, labels)

    def _eval_end(self, split: str) -> None:
        self._split_loss(split)
        for spec in self.metrics:
            metric = self.accuracy[spec.name]
            self.log(spec.key(split), metric.compute(), prog_bar=split == "val", sync_dist=False)
            metric.reset()


@TASK.register("classify")
def build(config: dict, datamodule: L.LightningDataModule) -> ClassificationTask:
    """The encoder classifier the config describes over the inputs the data declares."""
    return ClassificationTask(build_classifier(config, datamodule), datamodule.num_classes,
                              config["optim"], max_steps=config["trainer"]["max_steps"])
