"""``logger=wandb``: one W&B run per xbench run, offline without an account.

A run is named by its run id, grouped by its study (``experiment_name``), typed by its row
(:func:`row_of`: what it trains, less the seed) and tagged with its group choices
(``attention:full``); its config is the resolved config, nested as it is; its summary ends with
the record's headline numbers (:func:`headline`), so a table rebuilt from a W&B export shows
what ``make table`` shows.  The runs of one sweep share one W&B folder (the first job's
``hydra.sweep.dir``) and the sweep ends with one ``wandb sync`` command for all of them.

``mode: auto`` follows ``WANDB_MODE`` when it is set, else goes online only when an API key is
available (``WANDB_API_KEY`` or a ``~/.netrc`` entry for the W&B host) and offline otherwise,
so a laptop or a cluster node without network never stops at a login prompt.
"""

from __future__ import annotations

import hashlib
import json
import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lightning.pytorch.loggers import WandbLogger

MODES = ("auto", "online", "offline", "disabled")
MAX_LENGTH = 64
"""W&B's longest tag; job types are kept as short."""
NOT_TAGGED = ("logger",)
"""Choices that say nothing about what ran (how it was logged)."""
SUMMARY_KEYS = ("status", "params", "active_params", "flops_per_step", "step_memory_mb",
                "steps", "primary_metric", "error")
"""Record keys copied into the summary as they are; ``final`` and ``test`` are spread out."""


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


def row_of(record: dict[str, Any]) -> str:
    """The run's row, the same for all its seeds: the run id's readable prefix and a hash of
    what it computes less the seed and the study (``vanilla-full-layernorm-relu-sinusoidal_
    3fa9c10b``): one row across studies, two rows for any setting that changes a result."""
    from xformer_bench.results.record import identity_config

    row = {k: v for k, v in identity_config(record["config"]).items()
           if k not in ("seed", "experiment_name")}
    digest = hashlib.sha1(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:8]
    prefix = record["run_id"].rsplit("_s", 1)[0]
    return f"{prefix[:MAX_LENGTH - 9]}_{digest}"


def tags_of(spec: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """``logger.tags``, then ``group:choice`` for each group the run chose."""
    choices = [f"{group}:{choice}"[:MAX_LENGTH] for group, choice in record["choices"].items()
               if choice is not None and group not in NOT_TAGGED]
    return list(dict.fromkeys([*spec["tags"], *choices]))


def headline(record: dict[str, Any]) -> dict[str, Any]:
    """The record's numbers a table shows: :data:`SUMMARY_KEYS`, the final validation point as
    ``final/<metric>`` (``final/val/bpb``, ``final/step``) and the test metrics as logged
    (``test/bpb``)."""
    final = {f"final/{key}": value for key, value in (record.get("final") or {}).items()}
    given = {k: record[k] for k in SUMMARY_KEYS if record.get(k) is not None}
    return {**given, **final, **(record.get("test") or {})}


class _Sweep:
    """The W&B folder of the sweep running in this process, and its offline runs so far."""

    report: Any = None
    folder: Path | None = None
    offline: int = 0


def _save_dir(run_dir: Path) -> Path:
    """Where W&B writes its ``wandb/`` folder: the run's own directory for a single run; for a
    sweep's jobs, the first job's ``hydra.sweep.dir`` (its parent folder outside Hydra)."""
    import xformer_bench.sweep_report as sweep_report

    report = sweep_report.current()
    if report is None:
        return run_dir
    if _Sweep.report is not report:
        _Sweep.report, _Sweep.folder, _Sweep.offline = report, _sweep_dir() or run_dir.parent, 0
    return _Sweep.folder


def _sweep_dir() -> Path | None:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().sweep.dir) if HydraConfig.initialized() else None


def build_wandb_logger(spec: dict[str, Any], run_dir: Path, record: dict[str, Any]) -> WandbLogger:
    import wandb

    if wandb.run is not None:  # a run left open by an earlier job: never log into it
        wandb.finish(exit_code=1)
    mode = resolve_mode(spec["mode"])
    save_dir = _save_dir(run_dir).absolute()  # wandb-core may run in another folder
    save_dir.mkdir(parents=True, exist_ok=True)
    # `mode` (not WandbLogger's `offline`, which rewrites WANDB_MODE for every later run).
    return WandbLogger(
        name=record["run_id"], save_dir=str(save_dir), project=spec["project"],
        entity=spec["entity"], group=record["experiment"], job_type=row_of(record),
        tags=tags_of(spec, record), config=record["config"], mode=mode,
        settings=wandb.Settings(silent=True),
    )


def finish(record: dict[str, Any]) -> None:
    """Put the record's :func:`headline` in the summary, close the W&B run (the next run of a
    sweep opens its own) and say how to upload it: at once for a single run, once at its end
    for a sweep (:mod:`xformer_bench.sweep_report`)."""
    import wandb

    import xformer_bench.sweep_report as sweep_report

    run = wandb.run
    if run is None:  # never started (ranks other than zero, or a failure before fit)
        return
    run.summary.update(headline(record))
    offline = run.settings.mode in ("offline", "dryrun")
    run_folder, url = Path(run.dir).parent, None if offline else run.url
    wandb.finish(exit_code=0 if record.get("status") == "finished" else 1)
    report = sweep_report.current()
    if offline and report is not None and report is _Sweep.report:
        _Sweep.offline += 1
        report.notes["wandb"] = (f"[xbench] wandb ran {_Sweep.offline} run(s) of this sweep "
                                 f"offline; upload with: wandb sync {run_folder.parent}")
    elif offline:
        print(f"[xbench] wandb ran offline; upload with: wandb sync {run_folder}")
    elif url:
        print(f"[xbench] wandb run: {url}")
