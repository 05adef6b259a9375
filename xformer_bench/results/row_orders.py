"""Whether a study's rows keep their order between two sets of runs: a study at two budgets
(narang_table1 at 300 and at 2,000 steps), or on two machines.

Each folder's rows are its table's rows (a ladder's inner rungs left out), each valued by the
table's first metric column (the test metric) averaged over finished seeds; rows are matched by
their label.  Agreement: Spearman's rho and Kendall's tau-b of the two sets of means
(:mod:`xformer_bench.results.paper`), the interval a percentile bootstrap over the first
folder's seeds (the second folder's means held fixed).

    python -m xformer_bench.results.row_orders FIRST_RECORDS SECOND_RECORDS [--experiment E]
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xformer_bench.errors import XbenchError
from xformer_bench.results.aggregate import columns_for
from xformer_bench.results.collect import collect
from xformer_bench.results.ladder_table import study_rows
from xformer_bench.results.paper import average_ranks, bootstrap, kendall_tau_b, spearman_rho
from xformer_bench.results.variants import group_variants


@dataclass(frozen=True)
class Rows:
    metric: str                        # the column's title ("text bpb")
    higher_is_better: bool
    seeds: dict[str, list[float]]      # row label -> its finished seeds' values


def study_values(results_dir: Path, experiment: str | None = None) -> tuple[str, Rows]:
    """The experiment of ``results_dir`` (the only one, unless named) and its rows' values."""
    found = collect(Path(results_dir))
    names = found.experiments()
    if experiment is None and len(names) != 1:
        raise XbenchError(f"{results_dir} holds {len(names)} experiments ({', '.join(names)}): "
                          "name one with --experiment")
    experiment = experiment or names[0]
    if experiment not in names:
        raise XbenchError(f"no records of {experiment} under {results_dir}; found "
                          f"{', '.join(names) or 'none'}")
    finished = [r for r in study_rows(found.of(experiment)) if r["status"] == "finished"]
    variants = group_variants(finished)
    _, metrics, loss_data = columns_for(variants)
    metric = next((m for m in metrics if m.data == loss_data), None)
    if metric is None:
        raise XbenchError(f"{experiment} under {results_dir} has no test metric to order by")
    seeds = {v.label: [r["test"][metric.test_key] * metric.spec.scale for r in v.on(metric.data)
                       if (r.get("test") or {}).get(metric.test_key) is not None]
             for v in variants}
    return experiment, Rows(metric.title, bool(metric.spec.higher_is_better),
                            {label: values for label, values in seeds.items() if values})


def _ranks(means: Sequence[float], higher_is_better: bool) -> np.ndarray:
    return average_ranks([-m if higher_is_better else m for m in means])


def compare(first: Rows, second: Rows, names: tuple[str, str]) -> str:
    """A Markdown table of the rows in both, in the first's order, and the agreement."""
    common = [label for label in first.seeds if label in second.seeds]
    if len(common) < 3:
        raise XbenchError(f"only {len(common)} rows are in both: nothing to order")
    means = [[float(np.mean(rows.seeds[label])) for label in common] for rows in (first, second)]
    ranks = [_ranks(m, first.higher_is_better) for m in means]
    order = sorted(range(len(common)), key=lambda i: ranks[0][i])
    lines = [f"| Row | {names[0]} | rank | {names[1]} | rank | moved |",
             "|:---|---:|---:|---:|---:|---:|"]
    for i in order:
        moved = ranks[1][i] - ranks[0][i]
        lines.append(f"| {common[i]} | {means[0][i]:.3f} | {ranks[0][i]:g} | {means[1][i]:.3f} "
                     f"| {ranks[1][i]:g} | {moved:+g} |")
    rho = bootstrap(spearman_rho, [first.seeds[label] for label in common], means[1])
    tau = kendall_tau_b(means[0], means[1])
    notes = [f"only in {name}: {', '.join(sorted(set(rows.seeds) - set(common)))}"
             for name, rows in zip(names, (first, second)) if set(rows.seeds) - set(common)]
    for name, rows in zip(names, (first, second)):
        most = max(len(rows.seeds[label]) for label in common)
        fewer = [f"{label} ({len(rows.seeds[label])})" for label in common
                 if len(rows.seeds[label]) < most]
        notes += [f"fewer seeds than {most} in {name}: {', '.join(fewer)}"] if fewer else []
    lines += ["", f"{len(common)} rows in both, by mean {first.metric} over finished seeds: "
              f"Spearman's rho {rho.text()} (95 % bootstrap over {names[0]}'s seeds), Kendall's "
              f"tau-b {tau:.2f}; moved: rank in {names[1]} minus rank in {names[0]} (positive: "
              f"the row ranks higher in {names[0]})." + "".join(f" {n[0].upper()}{n[1:]}."
                                                          for n in notes)]
    return "\n".join(lines)


def folder_name(path: Path) -> str:
    """A reference's name for its records folder (``<reference>/records``), else the path."""
    return path.resolve().parent.name if path.name == "records" else str(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xformer_bench.results.row_orders",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="a records folder (e.g. the longer budget's)")
    parser.add_argument("second", type=Path, help="the records folder to compare it with")
    parser.add_argument("--experiment", help="the study, when a folder holds several")
    args = parser.parse_args(argv)
    try:
        experiment, first = study_values(args.first, args.experiment)
        _, second = study_values(args.second, experiment)
        print(compare(first, second, (folder_name(args.first), folder_name(args.second))))
    except XbenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
