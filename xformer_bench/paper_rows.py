"""A study whose rows are a published table's (``rows_from: narang2021_table1``): one Hydra sweep
per keyed row of the table (:mod:`xformer_bench.references`), run one after another by
:func:`xformer_bench.ladder_sweeps.sweeps`.

A row's sweep is the command line, less the keys the row sets, plus

* the row's override list: the reference's, or the study's own for it at this scale
  (``scaled_rows: {label: [overrides]}``; ``scaled_rows=null`` on the command line runs the
  reference's);
* ``++paper_row='<label>'``: recorded with the run, outside its identity
  (:data:`~xformer_bench.results.record.IDENTITY_EXCLUDED`), so ``make table`` names and orders
  the rows as the paper does and sets each beside its own paper row;
* ``hydra.sweep.subdir=paper_row_<k>/<job>``: each row's jobs in a folder of their own.

The study's ``sweep:`` (its seeds) applies to each row's sweep.  A row the model refuses (one
:class:`~xformer_bench.errors.ConfigError` line, checked by building the model of the task the
data declares on the meta device: a decoder-only LM, an encoder-decoder on ``data=wmt14``)
and a row without an xbench option are not run: each is a planned skip, named with its reason,
and the table lists them under it (:func:`not_run_lines`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xformer_bench.config import compose_config
from xformer_bench.errors import XbenchError
from xformer_bench.preflight import MULTIRUN_FLAGS
from xformer_bench.references import ReferenceRow, load

TAG = "paper_row"
"""The config key a row's runs record their paper label under."""
NOT_RUN = "Not run on this assembly"
NO_OPTION = "no option yet"


@dataclass(frozen=True)
class PlannedRow:
    index: int                    # the row's place in the paper's table
    label: str
    overrides: tuple[str, ...]    # what makes the row (the reference's, or the study's scaled)
    refusal: str | None = None    # the model's one line, when it refuses the row


@dataclass(frozen=True)
class RowPlan:
    rows: tuple[PlannedRow, ...]  # every keyed row, in the paper's order
    missing: tuple[str, ...]      # rows without an xbench option yet

    @property
    def runnable(self) -> list[PlannedRow]:
        return [row for row in self.rows if row.refusal is None]

    @property
    def refused(self) -> list[PlannedRow]:
        return [row for row in self.rows if row.refusal is not None]


def key_of(override: str) -> str:
    """``++a.b=1`` -> ``a.b``."""
    return override.split("=", 1)[0].lstrip("+~")


def quoted(text: str) -> str:
    """``text`` as one single-quoted Hydra value."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def with_row(common: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """``common`` less the keys ``overrides`` set, then ``overrides``: the row wins."""
    keys = {key_of(o) for o in overrides}
    return [arg for arg in common if key_of(arg) not in keys] + list(overrides)


def refusal(overrides: Sequence[str]) -> str | None:
    """The one line the model refuses ``overrides`` with, or None: the assembly of the task
    the data declares (:func:`~xformer_bench.schema.data.task_of`; a decoder-only LM, an
    encoder-decoder) built on the meta device with the study's settings for the data
    (``option_settings``); a classifier's refusals come when it runs."""
    from xformer_bench.models.param_match import SEQ2SEQ_DATA, count_parameters
    from xformer_bench.option_settings import apply_option_settings
    from xformer_bench.schema.data import task_of

    config = apply_option_settings(compose_config(*overrides), list(overrides))
    task = task_of(config["data"])
    if task not in ("lm", "translate"):
        return None
    try:
        count_parameters(config, SEQ2SEQ_DATA if task == "translate" else None)
    except XbenchError as error:
        return str(error).splitlines()[0]
    return None


def one_job(argv: Sequence[str]) -> list[str]:
    """``argv`` as one job composes it: each swept value at its first, Hydra's own keys left
    out."""
    def first(arg: str) -> str:
        key, equals, value = arg.partition("=")
        whole = not equals or value[:1] in ("'", '"', "[", "{")  # a quoted value or a list
        return arg if whole else f"{key}={value.split(',')[0]}"

    return [first(arg) for arg in argv
            if arg not in MULTIRUN_FLAGS and not key_of(arg).startswith("hydra")]


def _row_overrides(row: ReferenceRow, scaled: dict[str, Any]) -> tuple[str, ...]:
    return tuple(scaled[row.label]) if row.label in scaled else row.overrides


def plan(config: dict[str, Any], common: Sequence[str]) -> RowPlan:
    """Every row of the study's ``rows_from`` table under the command line's ``common``
    arguments (``experiment=<study>`` among them): its overrides and any refusal."""
    table = load(str(config["rows_from"]))
    scaled = config.get("scaled_rows") or {}
    rows = []
    for index, row in enumerate(table.rows):
        if not row.overrides:
            continue
        overrides = _row_overrides(row, scaled)
        rows.append(PlannedRow(index, row.label, overrides,
                               refusal(with_row(one_job(common), overrides))))
    return RowPlan(tuple(rows), tuple(table.missing()))


def sweeps(config: dict[str, Any], argv: Sequence[str]) -> list[tuple[str, list[str] | None]]:
    """(title, argv) per row, in the paper's order; a row not run has argv None and a title
    that says why."""
    study_plan = plan(config, argv)
    out: list[tuple[str, list[str] | None]] = []
    for row in study_plan.rows:
        if row.refusal is not None:
            out.append((f"skipped paper row {row.label!r} ({NOT_RUN.lower()}): {row.refusal}",
                        None))
            continue
        out.append((f"paper row {row.index + 1} ({row.label})",
                    [*with_row(argv, row.overrides), f"++{TAG}={quoted(row.label)}",
                     f"hydra.sweep.subdir=paper_row_{row.index + 1}/${{hydra:job.num}}"]))
    out += [(f"skipped paper row {label!r} ({NO_OPTION})", None) for label in study_plan.missing]
    return out


def not_run_lines(experiment: str, records: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The lines under a ``rows_from`` study's table naming its paper rows without runs: those
    the model refuses (with the reason, on the records' data), those without an option, and
    those not run yet; nothing for another study."""
    if not records:
        return ()
    config = records[0]["config"]
    if not config.get("rows_from"):
        return ()
    table = load(str(config["rows_from"]))
    ran = {str(r["config"].get(TAG)) for r in records}
    data = str(records[0]["choices"].get("data") or config["data"]["name"])
    context = [f"experiment={experiment}", f"data={data}"]
    scaled = config.get("scaled_rows") or {}
    refused, pending = [], []
    for row in table.keyed():
        if row.label in ran:
            continue
        why = refusal(with_row(context, _row_overrides(row, scaled)))
        (refused.append(f"{row.label} ({why})") if why else pending.append(row.label))
    lines = [f"{NOT_RUN} (refused in one line): {'; '.join(refused)}." if refused else "",
             f"Paper rows with {NO_OPTION}: {', '.join(table.missing())}."
             if table.missing() else "",
             f"Paper rows not run yet: {', '.join(pending)}." if pending else ""]
    return tuple(line for line in lines if line)
