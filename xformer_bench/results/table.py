"""A comparison table as data (columns, rows of cells) and the cell text every format shares.

The renderers (:mod:`markdown`, :mod:`latex`, :mod:`csv_table`) differ only in a
:class:`Style`: how "missing", "±" and bold are written and how text is escaped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xformer_bench.results.baseline_standing import EARLY_LEARNING
from xformer_bench.results.final_validation import UNKNOWN
from xformer_bench.results.significance import ALPHA

SI_PREFIXES = ((12, "T"), (9, "G"), (6, "M"), (3, "K"))


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    kind: str = "number"                  # number | si (params, FLOPs) | text (seeds) | paper
    digits: int = 3                       # | signed (a difference: +0.012)
    higher_is_better: bool | None = None  # None: not a metric, never bold
    note: str = ""                        # its definition in a short caption (layout.py)


@dataclass(frozen=True)
class Cell:
    mean: float | None = None
    std: float | None = None              # None with one value: shown as the mean alone
    n: int = 0
    text: str | None = None               # shown instead of a number ("diverged", "2/3")
    bold: bool = False
    marked: bool = False                  # differs from the baseline row (Welch, p < 0.05)
    untestable: bool = False              # seeds on both sides, none varies: no t-test
    p_value: float | None = None          # Welch's, against the baseline row, uncorrected
    footnote: str = ""                    # marks explained in the caption ("*": perturbed)
    agreement: str = ""                   # a Paper cell: "agrees" / "disagrees" / "within noise"

    @property
    def missing(self) -> bool:
        return self.mean is None and self.text is None


@dataclass(frozen=True)
class Row:
    label: str
    key: tuple[tuple[str, str], ...]
    cells: tuple[Cell, ...]               # one per column
    finished: int
    total: int
    statuses: str                         # "diverged=1;finished=2"
    differences: tuple = ()               # confounds.Difference s from the baseline row


@dataclass(frozen=True)
class Table:
    experiment: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    loss_data: str                        # label of the dataset the loss columns come from
    note: str | None = None               # the caption, when not a study's (benchmarks)
    baseline: str | None = None           # label of the row the others are tested against
    noise_floor: tuple[tuple[str, float], ...] = ()  # (metric title, the baseline's seed std)
    comparisons: int = 0                  # rows tested against the baseline, per metric
    notes: tuple[str, ...] = ()           # sentences the columns add to the caption
    summary: tuple[str, ...] = ()         # lines under the table (the paper beside it)
    final_at: str = UNKNOWN               # where "final" was validated (final_validation.final_at)
    early_learning: bool = False          # the baseline has not learned (baseline_standing)
    legend: str | None = None             # a short caption (layout.py): the rest goes below


@dataclass(frozen=True)
class Style:
    missing: str
    plus_minus: str
    bold: Callable[[str], str]
    escape: Callable[[str], str]
    dagger: str = "†"


def si(value: float) -> str:
    """826112 -> '826K', 23353884672 -> '23.4G' (three significant digits)."""
    rounded = float(f"{value:.3g}")
    for exponent, prefix in SI_PREFIXES:
        if abs(rounded) >= 10**exponent:
            return f"{rounded / 10**exponent:.3g}{prefix}"
    return f"{rounded:.3g}"


def number(value: float, column: Column) -> str:
    if column.kind == "si":
        return si(value)
    return f"{value:{'+' if column.kind == 'signed' else ''}.{column.digits}f}"


def cell_text(cell: Cell, column: Column, style: Style) -> str:
    if cell.text is not None:
        body = style.escape(cell.text)
    elif cell.mean is None:
        return style.missing
    else:
        body = number(cell.mean, column)
        if cell.std is not None:
            body += style.plus_minus + number(cell.std, column)
    body = style.bold(body) if cell.bold else body
    body += style.escape(cell.footnote)
    body = body + style.dagger if cell.marked else body
    return f"{body} {style.escape(cell.agreement)}" if cell.agreement else body


def caption(table: Table, plus_minus: str, missing: str, dagger: str = "†") -> str:
    if table.note is not None:
        return table.note
    tested = (f" {dagger}: differs from the baseline row, {table.baseline}, by Welch's t-test "
              f"over seeds, Holm-Bonferroni corrected over the {table.comparisons} rows compared "
              f"per metric (family-wise p < {ALPHA}); a difference below the baseline's "
              "seed-to-seed std (the noise floor: "
              + (", ".join(f"{title} {std:.3g}" for title, std in table.noise_floor)
                 or "not measured, fewer than two baseline seeds")
              + ") is never marked nor bold." if table.baseline else "")
    untestable = [f"{row.label} ({column.title})" for row in table.rows
                  for column, cell in zip(table.columns, row.cells) if cell.untestable]
    if untestable:
        tested += (" Not testable (no variance over seeds in the row or the baseline): "
                   f"{', '.join(untestable)}.")
    marked = f" ({EARLY_LEARNING})" if table.early_learning else ""
    return (f"{table.experiment}{marked}: mean{plus_minus}std (sample) over finished seeds; "
            f"Seeds: finished/total runs on {table.loss_data}; early/final loss: validation "
            f"loss on {table.loss_data} at 1/8 of training and at {table.final_at}; "
            f"best per metric in bold; {missing}: not measured.{tested}"
            + "".join(f" {sentence}" for sentence in table.notes))
