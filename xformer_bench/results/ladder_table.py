"""A study's ablation ladders as tables (:mod:`xformer_bench.ladder`): per ladder, its rungs in
order, each with the primary metric over seeds, its gain over the rung above, its share of the
ladder's total gain (baseline -> preset) and the significance of the step -- Welch's t-test
against the rung above over seeds, Holm-Bonferroni corrected over the ladder's steps.

A rung's runs are found by their configuration, not by the ``ladder`` tag a run records (a
rung two ladders share, or a study's row, is one run, tagged by whichever ran it first): the
variant whose model is the rung's and that has exactly the ladder's changes up to this rung
(:func:`~xformer_bench.results.confounds.differences` from the composed baseline); of several,
the one that differs from the baseline in least else.  The study's main table leaves out the
rungs between the baseline and the preset (:func:`study_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from xformer_bench.config import find_config
from xformer_bench.ladder import Ladder, Rung, comparable, composed, study_overrides
from xformer_bench.results.aggregate import columns_for
from xformer_bench.results.columns import AFTER_METRICS, metric_spec
from xformer_bench.results.confounds import differences
from xformer_bench.results.metrics import Metric
from xformer_bench.results.significance import holm_bonferroni, welch_p_value
from xformer_bench.results.table import Cell
from xformer_bench.results.variants import Variant

SEEDS = next(spec for spec in AFTER_METRICS if spec.column.key == "seeds")


@dataclass(frozen=True)
class Step:
    rung: Rung
    cell: Cell                    # the metric, mean ± std over the rung's finished seeds
    seeds: Cell                   # finished/total runs
    gain: float | None = None     # over the rung above; positive: better
    share: float | None = None    # of the ladder's total gain
    p_value: float | None = None  # Welch's, against the rung above, uncorrected
    significant: bool = False     # Holm-corrected over the ladder's steps, above the noise floor


@dataclass(frozen=True)
class LadderTable:
    experiment: str
    preset: str                   # the preset's name ("transformer_xl")
    system: str                   # its label ("Transformer-XL")
    baseline: str                 # the baseline's label
    metric: Metric
    total: float | None           # the gain from the first rung to the last
    steps: tuple[Step, ...]


def intermediate(record: dict[str, Any]) -> bool:
    """A run made for a rung between a ladder's baseline and its preset (not a study's row)."""
    tag = record["config"].get("ladder") or {}
    return bool(tag) and tag.get("rung", 0) > 0 and record["choices"].get("model") != tag.get(
        "system")


def study_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the study's own rows: every one but :func:`intermediate` rungs' (all of
    them when that would leave none)."""
    return [r for r in records if not intermediate(r)] or records


def ladder_systems(records: list[dict[str, Any]], declared: Any) -> list[str]:
    """The presets whose ladders a table shows: the study's ``ladders:`` list, else those its
    runs were made for (``ladders: command_line``)."""
    from xformer_bench.ladder_sweeps import COMMAND_LINE, listed

    if declared and declared != COMMAND_LINE:
        return listed(declared)
    tags = [r["config"].get("ladder") or {} for r in sorted(records, key=lambda r: r["run_id"])]
    return list(dict.fromkeys(str(t["system"]) for t in tags if t.get("system")))


def gains(means: Sequence[float | None], higher_is_better: bool
          ) -> tuple[list[float | None], list[float | None], float | None]:
    """Each rung's gain over the rung above (None for the first, or without both means), its
    share of the total gain from the first rung to the last, and that total."""
    sign = 1.0 if higher_is_better else -1.0
    steps = [None] + [sign * (b - a) if a is not None and b is not None else None
                      for a, b in zip(means, means[1:])]
    total = (sign * (means[-1] - means[0])
             if len(means) > 1 and means[0] is not None and means[-1] is not None else None)
    shares = [g / total if g is not None and total else None for g in steps]
    return steps, shares, total


def _significance(cells: list[Cell]) -> tuple[list[float | None], list[bool]]:
    """Per step, Welch's p against the rung above and whether it survives Holm's correction
    over the ladder's steps and exceeds the rung above's seed-to-seed std."""
    p_values: list[float | None] = [None]
    for above, cell in zip(cells, cells[1:]):
        testable = above.mean is not None and cell.mean is not None
        p_values.append(welch_p_value(cell.mean, cell.std or 0.0, cell.n, above.mean,
                                      above.std or 0.0, above.n) if testable else None)
    held = holm_bonferroni(p_values)
    marked = [held[i] and abs(cells[i].mean - cells[i - 1].mean) >= (cells[i - 1].std or 0.0)
              for i in range(len(cells))]
    return p_values, marked


def _changes(variant: Variant, base: dict[str, Any]) -> set[str]:
    record = min(variant.records, key=lambda r: r["status"] != "finished")
    return {d.text for d in differences(comparable(record["choices"], record["config"]), base, ())}


def rung_variants(chain: Ladder, variants: list[Variant], study: str | None
                  ) -> list[Variant | None]:
    """The variant of each rung (None where none ran it)."""
    base = composed(*study_overrides(study), f"model={chain.baseline}")
    found = {v.key: _changes(v, base) for v in variants}
    every = {change for rung in chain.rungs if rung.part for change in rung.part.changes}
    chosen: list[Variant | None] = []
    for rung in chain.rungs:
        model = chain.system if rung is chain.rungs[-1] else chain.baseline
        wanted = {c for r in chain.rungs[1:rung.index + 1] if r.part for c in r.part.changes}
        fits = [v for v in variants if str(v.records[0]["choices"].get("model")) == model
                and found[v.key] & every == wanted]
        chosen.append(min(fits, key=lambda v: len(found[v.key] - every), default=None))
    return chosen


def _label(variant: Variant | None, preset: str) -> str:
    """The row name of the variant's model, else the preset's own ``label`` (a rung not run
    yet), else its name."""
    node = variant.records[0]["config"].get("model") if variant else None
    if not node:
        path = find_config("model", preset)
        node = OmegaConf.load(path).get("model") if path else None  # @package _global_
    return str((node or {}).get("label") or preset)


def ladder_table(experiment: str, chain: Ladder, variants: list[Variant],
                 study: str | None = None) -> LadderTable | None:
    """The table of one ladder over the study's variants; None when the records have no metric."""
    _, metrics, loss_data = columns_for(variants)
    metric = next((m for m in metrics if m.data == loss_data), None)
    if metric is None:
        return None
    chosen = rung_variants(chain, variants, study)
    runs = [v.on(metric.data) if v else [] for v in chosen]
    cells = [metric_spec(metric, v.on).cell(r) if v else Cell() for v, r in zip(chosen, runs)]
    steps, shares, total = gains([c.mean for c in cells], bool(metric.spec.higher_is_better))
    p_values, marked = _significance(cells)
    rows = tuple(Step(rung, cell, SEEDS.cell(r), gain, share, p, mark) for rung, cell, r, gain,
                 share, p, mark in zip(chain.rungs, cells, runs, steps, shares, p_values, marked))
    return LadderTable(experiment, chain.system, _label(chosen[-1], chain.system),
                       _label(chosen[0], chain.baseline), metric, total, rows)
