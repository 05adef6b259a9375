"""``logger=wandb``: one W&B run per xbench run, grouped by experiment, offline without an account.

``mode: auto`` follows ``WANDB_MODE`` when it is set, else goes online only when an API key is
available (``WANDB_API_KEY`` or a ``~/.netrc`` entry for the W&B host) and offline otherwise,
so a laptop or a cluster node without network never stops at a login prompt.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lightning.pytorch.loggers import WandbLogger

from xformer_bench.config import flatten

MODES = ("auto", "online", "offline", "disabled")


def has_api_key() -> bool:
    """True when wandb could log in without asking: an API key in the environment or netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = os.environ.get("NETRC", str(Path.home() / ".netrc"))
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode(configured: str) -> str:
    if configured not in MODES:
        raise ValueError(f"logger.mode={configured!r}; choose one of: {', '.join(MODES)}")
    if configured != "auto":
        return configured
    from_env = os.environ.get("WANDB_MODE", "").strip().lower()
    if from_env:
        return "offline" if from_env == "dryrun" else from_env
    return "online" if has_api_key() else "offline"


def run_config(record: dict[str, Any]) -> dict[str, Any]:
    """The resolved config, flattened, plus each group's choice as a top-level key (every group
    the record names: filter and group by them)."""
    return {**flatten(record["config"]), **record["choices"], "run_id": record["run_id"],
            "experiment": record["experiment"], "seed": record["seed"]}


def build_wandb_logger(spec: dict[str, Any], run_dir: Path, record: dict[str, Any]) -> WandbLogger:
    import wandb

    mode = resolve_mode(spec["mode"])
    run_dir.mkdir(parents=True, exist_ok=True)
    # `mode` (not WandbLogger's `offline`, which rewrites WANDB_MODE for every later run).
    return WandbLogger(
        name=record["run_id"], save_dir=str(run_dir), project=spec["project"],
        entity=spec["entity"], group=record["experiment"], tags=list(spec["tags"]),
        config=run_config(record), mode=mode, settings=wandb.Settings(silent=True),
    )


def finish(failed: bool) -> None:
    """Close the W&B run (the next run of a sweep opens its own) and say how to upload it."""
    import wandb

    run = wandb.run
    if run is None:  # never started (ranks other than zero, or a failure before fit)
        return
    offline = run.settings.mode in ("offline", "dryrun")
    run_folder, url = Path(run.dir).parent, None if offline else run.url
    wandb.finish(exit_code=1 if failed else 0)
    if offline:
        print(f"[xbench] wandb ran offline; upload with: wandb sync {run_folder}")
    elif url:
        print(f"[xbench] wandb run: {url}")
