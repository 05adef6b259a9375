"""``python -m xformer_bench.results``: run records -> LaTeX/Markdown/CSV tables and plots."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xformer_bench.results.report import UnknownExperimentError, make_tables


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m xformer_bench.results",
        description="Aggregate the run records under --results-dir into one table per "
                    "experiment (.tex, .md, .csv) plus validation-curve and trade-off plots.")
    parser.add_argument("--results-dir", type=Path, default=Path("results"),
                        help="folder searched for run records (default: results)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where tables and plots go (default: <results-dir>/tables)")
    parser.add_argument("--experiment", nargs="+", action="extend", default=[], metavar="NAME",
                        help="only these experiments (default: every one found)")
    parser.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out if args.out is not None else args.results_dir / "tables"
    try:
        written = make_tables(args.results_dir, out, args.experiment, plots=not args.no_plots)
    except UnknownExperimentError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not written:
        print(f"error: no valid run records under {args.results_dir}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
