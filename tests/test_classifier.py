"""The encoder classifier: padding keys never reach real positions (every option that
declares a key padding mask), padded and unpadded inputs classify alike, an encoder refuses
attention without a bidirectional form, and tiny classifiers learn separable data."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch

from xformer_bench.config import CONF_DIR
from xformer_bench.data.example_batches import ExampleDataModule
from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.models.transformer_classifier import TransformerClassifier, encoder_length
from xformer_bench.position import Position
from xformer_bench.tasks.classify import ClassificationTask

DIMS = ModelDims(d_model=32, n_heads=2, n_layers=2, d_ff=64, seq_len=16, vocab_size=12)
PARTS = ({"name": "layernorm"}, {"name": "gelu"}, {"name": "learned"}, {"name": "dense"},
         {"name": "standard"})
OPTIONS = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml"))


def _mixer(name: str):
    import yaml

    spec = yaml.safe_load((CONF_DIR / "attention" / f"{name}.yaml").read_text())
    return build_token_mixer(spec, DIMS)


@pytest.mark.parametrize("name", OPTIONS)
def test_padding_keys_never_reach_real_positions(name):
    """Whatever sits at padded positions, the non-padded outputs do not move (bidirectional)."""
    torch.manual_seed(0)
    mixer = _mixer(name).eval()
    provides = getattr(mixer, "provides", frozenset())
    if not {"bidirectional", "key_padding_mask"} <= provides:
        pytest.skip(f"attention={name} declares no bidirectional padded form")
    padding = torch.zeros(2, 16, dtype=torch.bool)
    padding[1, -5:] = True
    x = torch.randn(2, 16, 32)
    y = x.clone()
    y[1, -5:] = 10 * torch.randn(5, 32)  # different contents at the padding
    ctx = lambda: ForwardContext(Position(), causal=False, key_padding_mask=padding)  # noqa: E731
    with torch.random.fork_rng():
        a = mixer(x, ctx())
    with torch.random.fork_rng():
        b = mixer(y, ctx())
    torch.testing.assert_close(a[~padding], b[~padding], atol=1e-5, rtol=1e-4)


def _classifier(pool: str, pad_id: int | None = 0, attention: str = "full", **kw):
    dims = ModelDims(32, 2, 2, 64, encoder_length("tokens", 16, None, 4, pool), 12)
    return TransformerClassifier(dims, {"name": attention}, *PARTS, num_classes=3,
                                 pad_id=pad_id, pool=pool, **kw)


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_padding_appended_leaves_the_prediction_unchanged(pool):
    torch.manual_seed(0)
    model = _classifier(pool).eval()
    torch.nn.init.normal_(model.head.weight)  # the zero-initialised head would hide everything
    tokens = torch.randint(1, 12, (1, 10))
    padded = torch.cat([tokens, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(tokens), model(padded), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(model(tokens), model(torch.cat([tokens, tokens[:, :6]], dim=1)))


def test_an_encoder_refuses_attention_without_a_bidirectional_form():
    with pytest.raises(ConfigError, match="an encoder .*needs bidirectional"):
        _classifier("cls", attention="retnet")


def test_head_starts_at_zero_so_training_starts_from_the_uniform_prediction():
    logits = _classifier("mean")(torch.randint(1, 12, (2, 16)))
    assert torch.equal(logits, torch.zeros_like(logits))


class Separable:
    """Two classes of (1, 8, 8) images: bright or dark top half, noise elsewhere."""

    def __init__(self, n: int, seed: int):
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, 2, n)
        self.images = rng.normal(size=(n, 1, 8, 8)).astype(np.float32)
        self.images[:, :, :4] += np.where(self.labels == 1, 1.5, -1.5)[:, None, None, None]

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices, rng=None):
        return torch.from_numpy(self.images[indices]), torch.from_numpy(self.labels[indices])


def test_a_tiny_vit_learns_separable_images():
    torch.manual_seed(0)
    data = ExampleDataModule({"train": Separable(256, 0), "val": Separable(64, 1),
                              "test": Separable(64, 2)}, batch_size=32, seed=0)
    dims = ModelDims(32, 2, 1, 64, encoder_length("image", 0, (1, 8, 8), 4, "cls"), 0)
    model = TransformerClassifier(dims, {"name": "full"}, *PARTS, num_classes=2,
                                  input_kind="image", image_shape=(1, 8, 8), patch_size=4)
    optim = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0, warmup_steps=5,
                 decay="cosine", min_lr_ratio=0.1)
    task = ClassificationTask(model, 2, optim, max_steps=40)
    trainer = L.Trainer(max_steps=40, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, accelerator="cpu")
    trainer.fit(task, datamodule=data)
    result = trainer.test(task, datamodule=data, verbose=False)[0]
    assert result["test/top1"] > 0.9 and task.evaluated_units["test"] == 64
