"""The resolved run config for a list of overrides, composed exactly as ``xbench`` does.

For scripts and tests; the CLI itself composes through ``@hydra.main``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose_config(*overrides: str) -> dict[str, Any]:
    """The resolved config (a plain dict) the CLI would build for ``overrides``."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)
