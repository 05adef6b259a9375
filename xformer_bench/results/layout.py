"""A study's table laid out for a paper page (the LaTeX table): the columns the study declares
(``table_columns: [params, step_s, metric, delta, p, paper]`` in conf/experiment/<study>.yaml,
:data:`DEFAULT` when absent, ``xbench-table --columns`` over both; a set of :data:`PRESETS`
stands for its columns), a column equal in every
row dropped (named once in the caption), and the derived columns:

* ``delta``: the primary metric's row mean minus the baseline row's (†: significant);
* ``p``: the Holm-corrected p of the Welch test :func:`aggregate.mark_significant` made;
* ``paper``: the paper's value beside the primary metric (else final loss), headed with its
  unit, and ``agrees``, its verdict, in a column of its own.

Any other name is a column key of the full table (``final_loss``, ``ops``,
``steps_per_sec_paper``, ``final_loss_agrees``) or an alias (:data:`ALIASES`).  The short
caption (``Table.legend``) states the setup and defines every column shown.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from xformer_bench.errors import ConfigError
from xformer_bench.references import ReferenceTable
from xformer_bench.results.baseline_standing import EARLY_LEARNING
from xformer_bench.results.columns import AFTER_METRICS, BEFORE_METRICS
from xformer_bench.results.paper_columns import AGREES, DISAGREES, SUFFIX, WITHIN_NOISE
from xformer_bench.results.table import Cell, Column, Table, cell_text

DEFAULT = ("params", "step_s", "metric", "delta", "p", "paper", "seeds")
PRESETS = {"default": DEFAULT,
           "quality": ("metric", "delta", "p", "paper", "seeds"),
           "losses": ("early_loss", "final_loss", "metric", "delta", "p", "seeds"),
           "cost": ("params", "ops", "step_s", "step_mib", "metric", "delta")}
"""Named column sets: a name in a column list stands for its columns (``--columns cost,p``)."""
ALIASES = {"step_s": "steps_per_sec", "steps_per_sec": "steps_per_sec", "step_mib": "step_memory",
           "peak_mib": "peak_memory", "attended_pct": "attended", "flops": "ops"}
VERDICT = {AGREES: "yes", DISAGREES: "no", WITHIN_NOISE: "≈"}
METRIC_NAMES = {"bpb": "bits per byte", "bits_per_dim": "bits per dimension",
                "bits_per_token": "bits per token", "ppl": "perplexity"}
DEFINITIONS = {
    "params": "Params: trainable parameters",
    "active_params": "Active params: parameters used per token",
    "ops": "Ops: FLOPs of one training step (forward and backward)",
    "attended": "Attended %: share of the allowed query-key pairs attended",
    "steps_per_sec": "Step/s: training steps per second",
    "step_memory": "Step MiB: memory one training step allocates at its peak (MiB)",
    "peak_memory": "Peak MiB: a run's peak GPU memory (MiB)",
    "early_loss": "Early loss: validation loss (nats/token) at 1/8 of training",
    "final_loss": "Final loss: validation loss (nats/token) at the end",
    "eval_protocol": "Eval: evaluation protocol",
    "seeds": "Seeds: finished/total runs",
}
LOSSES = ("early_loss", "final_loss")
KNOWN = {spec.column.key for spec in (*BEFORE_METRICS, *AFTER_METRICS)}


def _is_metric(column: Column) -> bool:
    return column.higher_is_better is not None and column.kind != "paper"


def primary(table: Table) -> int | None:
    """The index of the primary metric column: the first test metric, else the final loss."""
    keys = [c.key for c in table.columns]
    tests = [j for j, c in enumerate(table.columns) if _is_metric(c) and c.key not in LOSSES]
    return tests[0] if tests else (keys.index("final_loss") if "final_loss" in keys else None)


def _short(column: Column) -> str:
    """'text bpb' -> 'bpb' (the dataset is in the setup sentence)."""
    head, _, rest = column.title.partition(" ")
    return rest if rest and column.key.startswith(head + "_") else column.title


def holm_adjusted(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's (1979) adjusted p-values: p_(k) * (m - k + 1), made monotone, capped at 1; a
    row is significant at ALPHA exactly when :func:`significance.holm_bonferroni` says so."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, p * (len(tested) - rank)))
        adjusted[i] = running
    return adjusted


class _Builder:
    """The laid-out columns of one table: (column, its cell per row)."""

    def __init__(self, table: Table, paper: ReferenceTable | None):
        self.table, self.paper = table, paper
        self.keys = [c.key for c in table.columns]
        self.primary = primary(table)
        self.primary_key = None if self.primary is None else self.keys[self.primary]
        self.base = next((i for i, r in enumerate(table.rows) if r.label == table.baseline), None)

    def cells(self, j: int) -> list[Cell]:
        return [row.cells[j] for row in self.table.rows]

    def resolve(self, name: str) -> list[tuple[Column, list[Cell]]]:
        key = ALIASES.get(name, name)
        if key in ("metric", "delta", "p", "paper"):
            return getattr(self, "_" + key)()
        if key.endswith("_agrees") and key[:-len("_agrees")] + SUFFIX in self.keys:
            return [self._verdict(self.keys.index(key[:-len("_agrees")] + SUFFIX))]
        if key in self.keys:
            j = self.keys.index(key)
            return [self._paper_at(j)] if key.endswith(SUFFIX) else [(self._titled(j), self.cells(j))]
        found = [j for j, c in enumerate(self.table.columns)
                 if _is_metric(c) and c.key.endswith("_" + key)]
        if found:
            return [(self._titled(found[0]), self.cells(found[0]))]
        if key in KNOWN:  # a column these records cannot fill (no speed measured)
            return []
        raise ConfigError(f"table column {name!r}: none of {', '.join(self.keys)} nor "
                          "metric, delta, p, paper, <column>_agrees, nor a set: "
                          f"{', '.join(PRESETS)}")

    def _titled(self, j: int) -> Column:
        column = self.table.columns[j]
        note = DEFINITIONS.get(column.key) or (
            f"{_short(column)}: test {METRIC_NAMES.get(_short(column), _short(column))}")
        return replace(column, title=_short(column), note=note)

    def _metric(self):
        return [] if self.primary is None else [(self._titled(self.primary),
                                                 self.cells(self.primary))]

    def _delta(self):
        if self.primary is None or self.base is None:
            return []
        metric = self.table.columns[self.primary]
        base = self.cells(self.primary)[self.base]
        cells = [Cell() if i == self.base or None in (c.mean, base.mean)
                 else Cell(mean=c.mean - base.mean, n=1, marked=c.marked)
                 for i, c in enumerate(self.cells(self.primary))]
        note = (f"Δ {_short(metric)}: row mean minus the baseline's ({self.table.baseline}); "
                "†: Holm-corrected p < 0.05 and beyond the baseline's seed std")
        return [(Column("delta", f"Δ {_short(metric)}", kind="signed", digits=metric.digits,
                        note=note), cells)]

    def _p(self):
        if self.primary is None or self.base is None:
            return []
        adjusted = holm_adjusted([c.p_value for c in self.cells(self.primary)])
        cells = [Cell() if p is None else Cell(text="<0.001" if p < 0.001 else
                                               f"{p:.3f}" if p < 0.01 else f"{p:.2f}")
                 for p in adjusted]
        note = (f"p: Welch's t-test of {_short(self.table.columns[self.primary])} against the "
                f"baseline over seeds, Holm-corrected over {self.table.comparisons} rows")
        return [(Column("p", "p", kind="text", note=note), cells)]

    def _paper(self):
        order = [j for j in (self.primary, *(self.keys.index(k) for k in LOSSES[::-1]
                                             if k in self.keys)) if j is not None]
        for j in order:
            if self.keys[j] + SUFFIX in self.keys:
                at = self.keys.index(self.keys[j] + SUFFIX)
                return [self._paper_at(at), self._verdict(at)]
        return []

    def _quantity(self, measured: str) -> str | None:
        """The paper's column beside the measured column ``measured`` (paper_columns.beside)."""
        if self.paper is None:
            return None
        parts = measured.split("_")
        names = ["_".join(parts[k:]) for k in range(len(parts))]
        return next((self.paper.measures[n] for n in names if n in self.paper.measures), None)

    def _paper_at(self, j: int) -> tuple[Column, list[Cell]]:
        quantity = self._quantity(self.keys[j][:-len(SUFFIX)]) or "value"
        unit = ("× baseline" if self.paper and quantity in self.paper.ratio_to_baseline
                else (self.paper.units.get(quantity, "") if self.paper else "").split(",")[0])
        title = f"Paper {quantity.replace('_', ' ')}" + (f" ({unit})" if unit else "")
        source = f"{self.paper.short}'s " if self.paper else "the paper's "
        full = self.paper.units.get(quantity, "") if self.paper else ""
        note = f"Paper: {source}{quantity.replace('_', ' ')}" + (f" ({full})" if full else "")
        cells = [replace(c, agreement="") for c in self.cells(j)]
        return replace(self.table.columns[j], title=title, note=note), cells

    def _verdict(self, j: int) -> tuple[Column, list[Cell]]:
        cells = [Cell(text=VERDICT[c.agreement]) if c.agreement else Cell()
                 for c in self.cells(j)]
        return (Column(self.keys[j][:-len(SUFFIX)] + "_agrees", "Agrees", kind="text",
                       note="Agrees: the row's change against the baseline has the paper's "
                            "sign (yes/no; ≈: within the baseline's seed std)"), cells)


def setup_sentence(records: Sequence[dict[str, Any]], loss_data: str) -> str:
    """'Setup: d_model 128, 4 layers, 4 heads, 300 steps of batch 16 x 128 tokens, on Text.'"""
    config = next((r["config"] for r in records if isinstance(r.get("config"), dict)), {})
    model, data = config.get("model") or {}, config.get("data") or {}
    trainer = config.get("trainer") or {}
    parts = [f"d_model {model['d_model']}" if model.get("d_model") else "",
             f"{model['n_layers']} layers" if model.get("n_layers") else "",
             f"{model['n_heads']} heads" if model.get("n_heads") else "",
             f"{trainer['max_steps']} steps" if trainer.get("max_steps") else ""]
    if data.get("batch_size") and data.get("seq_len"):
        parts.append(f"batch {data['batch_size']} x {data['seq_len']} tokens")
    shown = ", ".join(p for p in parts if p)
    return f"Setup: {shown}, on {loss_data}." if shown else f"Data: {loss_data}."


def layout(table: Table, names: Sequence[str] | None = None,
           records: Sequence[dict[str, Any]] = (), paper: ReferenceTable | None = None) -> Table:
    """``table`` with the columns ``names`` (:data:`DEFAULT` when None), those equal in every
    row dropped, and its short caption (``legend``)."""
    if table.note is not None:  # a benchmark's table: its own caption, its own columns
        return table
    builder = _Builder(table, paper)
    chosen: list[tuple[Column, list[Cell]]] = []
    expanded = [c for n in names or DEFAULT for c in PRESETS.get(str(n).strip(), (n,))]
    for name in expanded:
        for column, cells in builder.resolve(str(name).strip()):
            if column.key not in {c.key for c, _ in chosen}:
                chosen.append((column, cells))
    style = _plain_style()
    kept, same = [], []
    for column, cells in chosen:
        texts = {cell_text(c, column, style) for c in cells}
        if all(c.missing for c in cells):
            continue
        if len(table.rows) > 1 and len(texts) == 1 and column.key not in ("delta", "p"):
            same.append(f"{column.title} {texts.pop()}")
            continue
        kept.append((column, cells))
    if any(c.key == "delta" for c, _ in kept):  # the Δ carries the †, once a row
        kept = [(c, [replace(x, marked=False) for x in cells] if c.key == builder.primary_key
                 else cells) for c, cells in kept]
    rows = tuple(replace(row, cells=tuple(cells[i] for _, cells in kept))
                 for i, row in enumerate(table.rows))
    marked = f" ({EARLY_LEARNING}: see the note)" if table.early_learning else ""
    legend = [f"{table.experiment}{marked}: mean ± std (sample) over finished seeds.",
              setup_sentence(records, table.loss_data),
              "; ".join(c.note for c, _ in kept if c.note) + "."]
    if same:
        legend.append(f"Same in every row: {', '.join(same)}.")
    return replace(table, columns=tuple(c for c, _ in kept), rows=rows, legend=" ".join(legend))


def _plain_style():
    from xformer_bench.results.markdown import STYLE

    return STYLE


def with_tests(table: Table, records: Sequence[dict[str, Any]] = (),
               paper: ReferenceTable | None = None) -> Table:
    """The full table (the Markdown's): each paper column split into the paper's value, headed
    with its quantity and unit, and its verdict; the Δ and p columns appended when it has a
    baseline."""
    builder = _Builder(table, paper)
    papers = [j for j, c in enumerate(table.columns) if c.kind == "paper"]
    chosen: list[tuple[Column, list[Cell]]] = []
    for j, column in enumerate(table.columns):
        if j not in papers:
            chosen.append((column, builder.cells(j)))
            continue
        value = builder._paper_at(j)
        if value[0].title not in {c.title for c, _ in chosen}:  # one header per quantity
            chosen.append(value)
        verdict, cells = builder._verdict(j)
        if len(papers) > 1:
            verdict = replace(verdict, title=f"Agrees ({table.columns[j - 1].title.lower()})")
        chosen.append((verdict, cells))
    extra = builder.resolve("delta") + builder.resolve("p")
    chosen += extra
    rows = tuple(replace(row, cells=tuple(cells[i] for _, cells in chosen))
                 for i, row in enumerate(table.rows))
    return replace(table, columns=tuple(c for c, _ in chosen), rows=rows,
                   notes=(*table.notes, *(f"{c.note}." for c, _ in extra)))
