"""Published tables as data: one CSV per paper table (a row per printed row, its cells as
printed, empty where the transcription could not read one) and a YAML sidecar with its
citation, its units, its baseline row and which of xbench's table columns each of its columns
sits beside (``measures``).  A column the paper prints as seconds per iteration may be read as
iterations per second (``reciprocals``: derived column -> printed column), so it sits beside
xbench's Step/s.

Each row's ``xbench`` cell is the Hydra override list that reproduces it (space-separated); an
empty one means xbench has no option for that row yet (:meth:`ReferenceTable.missing`).

Shipped: Narang et al. (2021) Table 1; Child et al. (2019) Tables 1 and 2; Dosovitskiy et al.
(2021) Table 1; Dai et al. (2019) Table 2 (its Transformer rows); Tay et al. (2021) Table 1.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class ReferenceRow:
    label: str
    overrides: tuple[str, ...]            # the xbench configuration; () where none exists yet
    cells: dict[str, str]                 # column -> the printed text ("223M", "1.838", "")

    def value(self, column: str) -> float | None:
        """The cell as a number; None where empty or not a plain number ("223M")."""
        try:
            return float(self.cells.get(column) or "")
        except ValueError:
            return None


@dataclass(frozen=True)
class ReferenceTable:
    name: str                             # "narang2021_table1": the files' stem
    citation: str
    short: str                            # "Narang et al. (2021) Table 1"
    setting: str
    rows: tuple[ReferenceRow, ...]
    baseline: str | None = None           # the row the paper's others are read against
    units: dict[str, str] = field(default_factory=dict)      # column -> unit
    stds: dict[str, str] = field(default_factory=dict)       # column -> its printed std column
    measures: dict[str, str] = field(default_factory=dict)   # xbench column/metric -> column
    ratio_to_baseline: tuple[str, ...] = ()  # columns compared as a ratio to the baseline row

    def row(self, label: str) -> ReferenceRow:
        return next(r for r in self.rows if r.label == label)

    def keyed(self) -> list[ReferenceRow]:
        """The rows an xbench configuration reproduces."""
        return [r for r in self.rows if r.overrides]

    def missing(self) -> list[str]:
        """The rows without an xbench option yet, by label."""
        return [r.label for r in self.rows if not r.overrides]


def names() -> list[str]:
    """Every shipped reference table."""
    return sorted(p.stem for p in HERE.glob("*.csv"))


@cache
def load(name: str) -> ReferenceTable:
    """The shipped table ``name``; ``KeyError`` naming the shipped ones otherwise."""
    if name not in names():
        raise KeyError(f"no reference table {name!r}; shipped: {', '.join(names())}")
    import yaml

    meta: dict[str, Any] = yaml.safe_load((HERE / f"{name}.yaml").read_text(encoding="utf-8"))
    with open(HERE / f"{name}.csv", newline="", encoding="utf-8") as f:
        rows = tuple(ReferenceRow(label=r.pop("row"), overrides=tuple(r.pop("xbench").split()),
                                  cells=_with_reciprocals(r, meta.get("reciprocals") or {}))
                     for r in csv.DictReader(f))
    return ReferenceTable(name=name, citation=" ".join(meta["citation"].split()),
                          short=meta["short"], setting=" ".join(meta["setting"].split()),
                          rows=rows, baseline=meta.get("baseline"),
                          units=meta.get("columns") or {}, stds=meta.get("stds") or {},
                          measures=meta.get("measures") or {},
                          ratio_to_baseline=tuple(meta.get("ratio_to_baseline") or ()))


def _with_reciprocals(cells: dict[str, str], reciprocals: dict[str, str]) -> dict[str, str]:
    """``cells`` plus each derived column 1 / its printed column (empty where that is)."""
    derived = {}
    for column, printed in reciprocals.items():
        value = ReferenceRow("", (), cells).value(printed)
        derived[column] = repr(1 / value) if value else ""
    return {**cells, **derived}
