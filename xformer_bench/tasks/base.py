"""What every task shares: the model, AdamW under the house schedule, and evaluation over
whole splits -- Lightning's validation / test hooks routed to ``_eval_step(batch, split)`` and
``_eval_end(split)``, with the split's summed loss and count accumulated across ranks
(torchmetrics ``SumMetric``) before dividing, so padding and short last batches never dilute it.
"""

from __future__ import annotations

import lightning as L
import torch
from torchmetrics import SumMetric

from xformer_bench.core.step_updates import apply_pending_updates, prepare_training_step
from xformer_bench.tasks.optimization import (adamw_with_schedule, check_finite,
                                               check_optimization)
from xformer_bench.training.log_steps import logs_this_step, shows_progress


class Task(L.LightningModule):
    def __init__(self, model: torch.nn.Module, optim: dict, max_steps: int):
        check_optimization(optim, max_steps)  # before training starts: one error line
        super().__init__()
        self.model, self.optim, self.max_steps = model, dict(optim), max_steps
        self.eval_nats, self.eval_count = SumMetric(), SumMetric()
        self.evaluated_units: dict[str, int] = {}

    def _eval_step(self, batch, split: str) -> None:
        raise NotImplementedError

    def _eval_end(self, split: str) -> None:
        raise NotImplementedError

    def _split_loss(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The split's summed nats and unit count (then reset); logs ``<split>/loss``, their
        ratio, and records the count in ``evaluated_units``."""
        nats, n = self.eval_nats.compute(), self.eval_count.compute()
        self.eval_nats.reset()
        self.eval_count.reset()
        self.evaluated_units[split] = int(n)
        self.log(f"{split}/loss", nats / n, prog_bar=split == "val", sync_dist=False)
        return nats, n

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    def check_finite(self, loss: torch.Tensor) -> None:
        """Stop with ``diverged`` when this or any other rank's training loss is NaN or inf:
        every step on a CPU; on a GPU every ``trainer.log_every_n_steps`` steps, so that the
        step never waits for the device (a resume point checks the parameters before it is
        saved: :mod:`xformer_bench.training.checkpoints`)."""
        trainer = self._trainer
        if loss.is_cuda and trainer is not None and \
                (self.global_step + 1) % max(trainer.log_every_n_steps, 1):
            return
        check_finite(loss, self.global_step, trainer.strategy if trainer is not None else None)

    def training_loss(self, nats: torch.Tensor, **metrics: torch.Tensor) -> torch.Tensor:
        """What a training step optimises: ``nats`` plus the model's auxiliary losses (routers,
        ACT, compression), checked finite (:meth:`check_finite`) and logged with ``metrics``."""
        auxiliary = self.model.auxiliary_loss()
        loss = nats if auxiliary is None else nats + auxiliary
        self.check_finite(loss)
        self.log_training(loss=nats, **metrics, aux_loss=auxiliary)
        return loss

    def log_training(self, **metrics: torch.Tensor | None) -> None:
        """Log per-step training metrics (``train/<name>``; None ones skipped) on the steps they
        are shown or written (:func:`~xformer_bench.training.log_steps.logs_this_step`); for the
        progress bar only while one is shown (a metric meant for the bar is read back to the
        host every step: :func:`~xformer_bench.training.log_steps.shows_progress`)."""
        if logs_this_step(self._trainer):
            bar = shows_progress(self._trainer)
            for name, value in metrics.items():
                if value is not None:
                    self.log(f"train/{name}", value, prog_bar=bar and name != "aux_loss")

    def configure_optimizers(self):
        return adamw_with_schedule(self, self.optim, self.max_steps)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None) -> None:
        """``trainer.gradient_clip_val``: the global gradient norm clipped as Lightning's default
        does (the optimizer's parameters, in its order), but directly where no gradient scaler
        is in play (fp32, bf16): Lightning's mixed-precision plugin refuses any clipping for an
        optimizer that unscales internally -- fused AdamW, xbench's on a GPU -- even in bf16,
        which has no scaler.  fp16 (scaled gradients) keeps Lightning's path and its error."""
        if not gradient_clip_val:
            return
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            return super().configure_gradient_clipping(optimizer, gradient_clip_val,
                                                       gradient_clip_algorithm)
        torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups
                                        for p in group["params"]], gradient_clip_val)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        prepare_training_step(self.model)  # state due before this step (Performer's redraw)

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        apply_pending_updates(self.model)  # state moved once a step (routing's centroids)
