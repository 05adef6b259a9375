"""bits per byte = mean next-byte cross-entropy (nats) / ln 2 over exactly the evaluated bytes;
the same task names its metric by the data's unit (bits per dim on images)."""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import pytest
import torch

from xformer_bench.data.byte_windows import ByteLMDataModule
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.transformer_lm import TransformerLM
from xformer_bench.tasks.lm import LanguageModelTask
from xformer_bench.metric_spec import BITS_PER
from xformer_bench.tasks.schedule import lr_factor


def _reference_bpb(model: torch.nn.Module, data: np.ndarray, seq_len: int) -> tuple[float, int]:
    """Independent protocol: walk the split window by window, sum -log p(next byte)."""
    nats, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(data) - 1, seq_len):
            chunk = torch.from_numpy(data[start:start + seq_len + 1].astype(np.int64))
            logp = model(chunk[None, :-1]).log_softmax(-1)[0]  # (t, V)
            nats -= logp.gather(1, chunk[1:, None]).sum().item()
            count += len(chunk) - 1
    return nats / count / math.log(2), count


def _validate(n_val: int, unit: str = "bytes") -> tuple[LanguageModelTask, dict, np.ndarray]:
    """A tiny untrained LM validated on ``n_val`` random bytes: the task, its metrics, the data."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    splits = {s: rng.integers(0, 256, n).astype(np.uint8) for s, n in
              (("train", 2000), ("val", n_val), ("test", 300))}
    dims = ModelDims(d_model=32, n_heads=2, n_layers=1, d_ff=64, seq_len=64, vocab_size=256)
    model = TransformerLM(dims, {"name": "full"}, {"name": "layernorm"}, {"name": "gelu"},
                          {"name": "sinusoidal"}).eval()
    task = LanguageModelTask(model, optim={}, max_steps=1, unit=unit)
    dm = ByteLMDataModule(splits, seq_len=64, batch_size=4, seed=0, eval_batch_size=3)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu")
    return task, trainer.validate(task, datamodule=dm, verbose=False)[0], splits["val"]


@pytest.mark.parametrize("n_val", [1001, 64 * 8 + 1, 130])
def test_validation_bpb_equals_reference_over_the_whole_split(n_val):
    task, metrics, val = _validate(n_val)
    expected, count = _reference_bpb(task.model, val, 64)
    assert task.evaluated_units["val"] == count == n_val - 1
    assert metrics["val/bpb"] == pytest.approx(expected, rel=1e-5)
    assert metrics["val/loss"] / math.log(2) == pytest.approx(metrics["val/bpb"], rel=1e-6)


def test_the_data_unit_names_the_metric_and_nothing_else_changes():
    byte_task, per_byte, _ = _validate(130)
    dim_task, per_dim, _ = _validate(130, unit="dims")
    assert (byte_task.metrics, dim_task.metrics) == ((BITS_PER["bytes"],), (BITS_PER["dims"],))
    assert set(per_byte) == {"val/loss", "val/bpb"} and set(per_dim) == {"val/loss",
                                                                         "val/bits_per_dim"}
    assert per_dim["val/bits_per_dim"] == per_byte["val/bpb"]
    assert dim_task.evaluated_units == byte_task.evaluated_units == {"val": 129}
    with pytest.raises(ConfigError, match="no metric per 'examples'"):
        LanguageModelTask(byte_task.model, optim={}, max_steps=1, unit="examples")


def test_untrained_untied_model_is_near_uniform():
    torch.manual_seed(0)
    dims = ModelDims(d_model=32, n_heads=2, n_layers=1, d_ff=64, seq_len=32, vocab_size=256)
    model = TransformerLM(dims, {"name": "full"}, {"name": "layernorm"}, {"name": "gelu"},
                          {"name": "none"}, head={"name": "softmax", "tie": False}).eval()
    data = np.random.default_rng(1).integers(0, 256, 500).astype(np.uint8)
    bpb, _ = _reference_bpb(model, data, 32)
    # logits ~ N(0, s^2) on unit-RMS features: cross-entropy ~ ln 256 + s^2 / 2 nats
    s2 = dims.d_model * model.head.vocab.weight.var().item()
    assert bpb == pytest.approx(8.0 + s2 / 2 / math.log(2), abs=0.1)


def test_learning_rate_schedule_warms_up_then_decays_to_the_floor():
    kwargs = dict(warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    assert lr_factor(0, decay="cosine", **kwargs) == pytest.approx(0.1)
    assert lr_factor(9, decay="cosine", **kwargs) == pytest.approx(1.0)
    assert lr_factor(60, decay="cosine", **kwargs) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(110, decay="cosine", **kwargs) == pytest.approx(0.1)
    assert lr_factor(60, decay="linear", **kwargs) == pytest.approx(0.55)
    assert lr_factor(60, decay="constant", **kwargs) == 1.0
    assert lr_factor(39, decay="inverse_sqrt", **kwargs) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="optim.decay"):
        lr_factor(0, decay="step", **kwargs)
