"""A finished run's weights for sampling: find them from what the user gives (a run record, a
Lightning checkpoint or a run's kept ``final.pt``) and build the record's model with them.

A record's weights are its run's ``<run_dir>/checkpoints/last.ckpt`` when it kept one
(``trainer.checkpoint=true``), else the final weights it names (``weights_path``:
:mod:`~xformer_bench.training.final_weights`), looked for where written and beside the record's
results folder; a record with neither is a :class:`~.sample_args.SampleError` that names the
command re-running it keeping them (the same run id).  Every failure to load is one such line.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import torch

from xformer_bench.sample_args import SampleError, first_line


def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SampleError(f"{path} is not a run record (JSON): {error}") from None
    if not isinstance(record, dict) or "config" not in record or "run_dir" not in record:
        raise SampleError(f"{path} is not a run record: it has no config / run_dir")
    return record


def locate(path: Path) -> tuple[dict[str, Any], Path]:
    """The run record and the weights of PATH (a record JSON, a ``.ckpt`` or a ``final.pt``)."""
    if not path.exists():
        raise SampleError(f"{path} does not exist: give a run record (results/<experiment>/"
                          "<run_id>.json), a checkpoint (.ckpt) or a run's final.pt")
    if path.suffix == ".ckpt":
        record_path = path.resolve().parent.parent / "record.json"
        if not record_path.exists():
            raise SampleError(f"no run record at {record_path} for checkpoint {path}: sample "
                              "from the run's record instead")
        return _read_record(record_path), path
    if path.suffix == ".pt":
        return _stamped_record(path), path
    record = _read_record(path)
    _check_task(record)
    checkpoint = Path(record["run_dir"]) / "checkpoints" / "last.ckpt"
    if checkpoint.exists():
        return record, checkpoint
    status = record.get("status", "finished")
    if status != "finished":  # a diverged run re-run keeping its weights diverges again
        why = str(record.get("error") or "").splitlines()[0:1]
        raise SampleError(f"run {record.get('run_id', path.stem)} did not finish (status "
                          f"{status}{': ' + why[0] if why else ''}): it has no final weights "
                          "to sample")
    return record, kept_weights(record, path)


def kept_weights(record: dict[str, Any], record_path: Path) -> Path:
    """The final weights the record names (``weights_path``), looked for as written and, when
    relative to the run's ``paths.results_dir``, under the folder the record itself is in
    (``<results_dir>/<experiment>/<run_id>.json``: from any directory, or a moved results
    folder); else a SampleError with the command that keeps them."""
    named = record.get("weights_path")
    if named:
        written = Path(named)
        candidates = [written]
        results_dir = Path(str(((record.get("config") or {}).get("paths") or {})
                               .get("results_dir", "results")))
        if not written.is_absolute() and written.is_relative_to(results_dir):
            candidates.append(record_path.resolve().parent.parent /
                              written.relative_to(results_dir))
        found = next((c for c in candidates if c.is_file()), None)
        if found is not None:
            return found
    why = f"{named} is missing" if named else "its record names no weights_path"
    raise SampleError(f"run {record.get('run_id', record_path.stem)} kept no weights ({why}); "
                      f"re-run it keeping them (same run id): {rerun_command(record)}")


KEEP_OVERRIDES = ("trainer.keep_weights=true", "skip_completed=false")
"""Appended to a run's overrides to train it again keeping its weights: ``skip_completed``
would skip it (the key is outside the run id, so the finished record is this run's)."""


def rerun_command(record: dict[str, Any]) -> str:
    """``xbench`` with the record's own overrides (a study job's: its experiment, row and seed)
    and :data:`KEEP_OVERRIDES`: one run, the same run id, its record replaced."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in KEEP_OVERRIDES}
    kept = [o for o in record.get("overrides") or []
            if isinstance(o, str) and o.split("=", 1)[0].lstrip("+~") not in keys]
    return shlex.join(["xbench", *kept, *KEEP_OVERRIDES])


def _stamped_record(path: Path) -> dict[str, Any]:
    """What of its record a ``final.pt`` carries (:mod:`~.training.final_weights`)."""
    stamp = _load_weights_file(path).get("xbench")
    record = stamp.get("record") if isinstance(stamp, dict) else None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise SampleError(f"{path} is no xbench run's final weights (no xbench record in it): "
                          "give a run record (.json), a .ckpt or a final.pt an xbench run wrote")
    _check_task(record)
    return record


def _load_weights_file(path: Path) -> dict[str, Any]:
    """A ``final.pt`` (plain tensors and JSON types: loaded with ``weights_only=True``)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 -- any reason a file does not load
        raise SampleError(f"weights {path} do not load ({first_line(error)}): the file is cut "
                          "short or not an xbench run's final.pt") from None
    return state if isinstance(state, dict) else {}


def _check_task(record: dict[str, Any]) -> None:
    if record.get("task", "lm") not in ("lm", None):
        raise SampleError(f"run {record.get('run_id')} trained task {record['task']}: "
                          "xbench-sample samples language models (task lm)")


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model's tensors in a Lightning checkpoint or a final.pt; a SampleError when it does
    not load."""
    if checkpoint.suffix != ".ckpt":
        state = _load_weights_file(checkpoint)
    else:
        state = _load_checkpoint(checkpoint)
    state = state.get("state_dict") if isinstance(state, dict) else None
    weights = {k.removeprefix("model."): v for k, v in (state or {}).items()
               if k.startswith("model.")}
    if "embedding.table.weight" not in weights:
        raise SampleError(f"checkpoint {checkpoint} holds no xbench language model (no "
                          "state_dict with model.embedding.table.weight): sample an xbench run")
    return weights


def _load_checkpoint(checkpoint: Path) -> Any:
    # A Lightning checkpoint holds more than tensors (loop and callback state): it is read
    # in full, so only sample from checkpoints you trust (your own runs).
    try:
        return torch.load(checkpoint, map_location="cpu", weights_only=False)
    except Exception as error:  # noqa: BLE001 -- any reason a file does not load
        raise SampleError(f"checkpoint {checkpoint} does not load ({first_line(error)}): it is "
                          "cut short or not a checkpoint; train the run again with "
                          "trainer.checkpoint=true") from None


def load_model(record: dict[str, Any], checkpoint: Path,
               device: str | torch.device = "cpu") -> torch.nn.Module:
    """The record's model with the checkpoint's weights, in eval mode."""
    from xformer_bench.models.build import build_model

    _check_task(record)
    weights = _weights(checkpoint)
    vocab_size = weights["embedding.table.weight"].shape[0]
    if vocab_size != 256 and record.get("eval_unit") != "dims":
        raise SampleError(f"run {record.get('run_id')} has a vocabulary of {vocab_size}: "
                          "xbench-sample samples byte-level and pixel models")
    model = build_model(record["config"], vocab_size=vocab_size)
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:
        raise SampleError(f"checkpoint {checkpoint} does not fit the model of its run record "
                          f"({first_line(error)}): give the record it was trained with") from None
    return model.to(device).eval()
