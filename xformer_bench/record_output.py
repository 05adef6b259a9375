"""Where a run's record goes: checked before training, written after it, and kept in the run
directory with a one-line error when results/ refuses it at the end (a full disk)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xformer_bench.errors import ConfigError, XbenchError
from xformer_bench.results import record as records
from xformer_bench.schema.folders import unwritable


def check_writable(config: dict[str, Any], run_id: str) -> None:
    """A one-line error before training when the record could not be written to its folder
    (or, while that does not exist, to the nearest folder above it that does)."""
    folder = records.results_path(config, run_id).parent
    reason = unwritable(folder)
    if reason is not None:
        raise ConfigError(f"cannot write run records to {folder} ({reason}); "
                          "free space or choose another with paths.results_dir=...")


def write_or_keep(record: dict[str, Any], config: dict[str, Any]) -> None:
    """The record to results/; when that fails at the end, a one-line error saying where the
    record was kept instead (the run directory)."""
    try:
        record["record_path"] = str(records.write_record(record, config))
    except OSError as error:
        kept = Path(record["run_dir"]) / "record.json"
        where = (f"the record ({record['status']}) is kept in {kept}" if kept.is_file()
                 else f"the record ({record['status']}) could not be kept either")
        raise XbenchError(f"cannot write {records.results_path(config, record['run_id'])} "
                          f"({error.strerror or error}); {where}: copy it there once there "
                          "is room") from None
