"""Shared test set-up: offline, CPU, small sizes, configs composed as the CLI does."""

from __future__ import annotations

import os

os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", XBENCH_OFFLINE="1",
                  WANDB_MODE="offline", WANDB_SILENT="true", TOKENIZERS_PARALLELISM="false")

import pytest  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from xformer_bench.cli import CONF_DIR  # noqa: E402
from xformer_bench.models.dims import ModelDims  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))


def compose_config(*overrides: str) -> dict:
    """The resolved config the CLI would build for these overrides."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture
def tiny_dims() -> ModelDims:
    return ModelDims(d_model=32, n_heads=4, n_layers=2, d_ff=64, seq_len=16)
