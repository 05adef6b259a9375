"""The folders a run will write -- its records and claims, its resume points, its run
directory -- checked creatable and writable before it starts, each refusal naming the key that
moves it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xformer_bench.errors import ConfigError


def unwritable(folder: Path) -> str | None:
    """Why files could not be written in ``folder`` (made as needed) -- its nearest existing
    ancestor is a file, or refuses a file -- else None.  Probes with a file it removes."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        return f"{existing} is a file"
    probe = existing / f".xbench-write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as error:
        return error.strerror or str(error)
    return None


def written(config: Mapping[str, Any]) -> list[tuple[str, Path, str]]:
    """``(key, folder, what)`` of each folder under ``paths`` a run writes."""
    paths, name = config["paths"], str(config["experiment_name"])
    results = Path(str(paths["results_dir"]))
    checkpoints = Path(str(paths.get("checkpoint_dir") or results / "checkpoints"))
    return [("paths.results_dir", results / name, "run records"),
            ("paths.checkpoint_dir", checkpoints / name, "resume points")]


def check_folders(config: Mapping[str, Any], run_dir: tuple[str, Path] | None = None) -> None:
    """:class:`ConfigError` for a datasets' folder (``paths.data_dir``) that is a file, and for
    the first folder the run could not write: its records, resume points and (``(key, path)``,
    e.g. ``("hydra.run.dir", ...)``) its run directory."""
    folders = written(config) + ([(run_dir[0], run_dir[1], "the run directory")]
                                 if run_dir else [])
    data_dir = Path(str(config["paths"].get("data_dir") or "data"))
    existing = next((p for p in (data_dir, *data_dir.parents) if p.exists()), Path("."))
    if not existing.is_dir():  # the datasets' folder is read, and written by downloads
        raise ConfigError(f"paths.data_dir={data_dir}: {existing} is a file, not a folder; "
                          "choose the datasets' folder with paths.data_dir=... or "
                          "$XBENCH_DATA_DIR")
    for key, folder, what in folders:
        reason = unwritable(folder)
        if reason is not None:
            raise ConfigError(f"cannot write {what} to {folder} ({reason}); free space or "
                              f"choose another with {key}=...")
