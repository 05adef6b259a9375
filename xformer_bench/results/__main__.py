"""``xbench-table`` (``make table``, ``make references``): run records -> LaTeX/Markdown/CSV
tables and plots.  ``python -m xformer_bench.results`` is the same command (this ``main``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xformer_bench.errors import XbenchError
from xformer_bench.results.report import NoRecordsError, UnknownExperimentError, make_tables
from xformer_bench.schema.folders import unwritable


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="xbench-table",
        description="Aggregate the run records under --results-dir into one table per "
                    "experiment (.tex, .md, .csv) plus plots: validation curves, each row's "
                    "difference from the baseline row, and quality against calibrated speed "
                    "(or parameters). Its bench/, reference/ and tables/ folders are not read: "
                    "`make table` renders your results/, `make references` each shipped "
                    "results/reference/<name>/records. Same as python -m xformer_bench.results.")
    parser.add_argument("--results-dir", type=Path, default=Path("results"),
                        help="folder searched for run records (default: results)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where tables and plots go (default: <results-dir>/tables)")
    parser.add_argument("--experiment", nargs="+", action="extend", default=[], metavar="NAME",
                        help="only these experiments (default: every one found)")
    parser.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    parser.add_argument("--columns", type=lambda text: [c for c in text.split(",") if c],
                        default=None, metavar="A,B,C",
                        help="the LaTeX table's columns, over each study's table_columns "
                             "(default: params,step_s,metric,delta,p,paper,seeds; also any "
                             "column key of the CSV, e.g. final_loss, ops, <column>_agrees, "
                             "and the sets default, quality, losses, cost)")
    parser.add_argument("--latex-float", choices=("table", "table*"), default="table",
                        help="the LaTeX float: table (one column of the page) or table* "
                             "(across both columns of a two-column paper)")
    parser.add_argument("--allow-empty", action="store_true",
                        help="no run record at all (none run yet) is no error: one line, exit 0")
    return parser.parse_args(argv)


def input_error(results_dir: Path, out: Path) -> str | None:
    """Why the tables could be neither read from ``results_dir`` nor written to ``out``."""
    if not results_dir.is_dir():
        return f"--results-dir {results_dir} is not a folder; choose one with --results-dir"
    reason = unwritable(out)
    if reason is not None:
        return f"cannot write tables to {out} ({reason}); choose another with --out"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out if args.out is not None else args.results_dir / "tables"
    problem = input_error(args.results_dir, out)
    if problem is not None:  # no records to read (1), or nowhere to write (2)
        print(f"error: {problem}", file=sys.stderr)
        return 1 if not args.results_dir.is_dir() else 2
    try:
        written = make_tables(args.results_dir, out, args.experiment, plots=not args.no_plots,
                              allow_empty=args.allow_empty, columns=args.columns,
                              latex_float=args.latex_float)
    except NoRecordsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except (UnknownExperimentError, XbenchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
