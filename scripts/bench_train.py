"""The training race: xbench's training path vs a hand-written loop and x-transformers.

    python scripts/bench_train.py                       # CPU: default, d256-L4, d512-L8
    python scripts/bench_train.py --sizes d1024-L12 --precision bf16-mixed   # on a GPU
    python scripts/bench_train.py --whole-run-seconds 0      # steady state only

On CPU it also times the whole run of xbench and of a hand-written script, each in a fresh
process, for about ``--whole-run-seconds`` of training (:mod:`xformer_bench.bench.whole_run`).

See :mod:`xformer_bench.bench.train_race` for what each contender runs.  Writes
``results/bench/train.{md,json}`` (``--out``): tokens/s, ms/step, step memory, MFU (CUDA), and
xbench's speed relative to the floor and to x-transformers.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from xformer_bench.bench.train_race import CONTENDERS, SIZES, as_rows, race
from xformer_bench.bench.whole_run import whole_run


def startup(row: dict) -> str:
    """The whole run's seconds to its first step, with its probes' share (xbench's)."""
    if row.get("whole_startup_seconds") is None:
        return ""
    probes = row.get("whole_probe_seconds")
    return f"{row['whole_startup_seconds']:.1f}" + ("" if probes is None else f" ({probes:.1f})")


def markdown(rows: list[dict], setting: str) -> str:
    lines = [f"Training race ({setting})", "",
             "| size | contender | params | tokens/s | ms/step | step MiB | MFU | vs floor "
             "| vs x-transformers | whole-run tokens/s | whole run vs floor | start-up s "
             "(probes) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = lambda v: "" if v is None else f"{v:.2f}x"  # noqa: E731
        mfu = "" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %"
        lines.append(f"| {r['size']} | {r['contender']} | {r['params']:,} | "
                     f"{r['tokens_per_sec']:,.0f} | {r['ms_per_step']:.1f} | "
                     f"{r['step_memory_mib']:.1f} | {mfu} | {ratio(r['vs_floor'])} | "
                     f"{ratio(r['vs_x_transformers'])} | "
                     f"{'' if r.get('whole_tokens_per_sec') is None else format(r['whole_tokens_per_sec'], ',.0f')} | "
                     f"{ratio(r.get('whole_vs_floor'))} | {startup(r)} |")
    return "\n".join(lines) + "\n"


def add_whole_runs(rows: list[dict], size: str, seconds: float) -> None:
    """Whole-run tokens/s of xbench and the hand-written floor at ``size`` (steps for about
    ``seconds`` of training at the floor's steady rate), and their ratio, into ``rows``."""
    by = {r["contender"]: r for r in rows}
    if not {"xbench", "floor"} <= by.keys():
        return
    steps = max(20, round(seconds * 1000 / by["floor"]["ms_per_step"]))
    for contender in ("floor", "xbench"):
        run = whole_run(contender, size, steps)
        by[contender].update(whole_tokens_per_sec=run["tokens_per_sec"], whole_run_steps=steps,
                             whole_startup_seconds=run["startup_seconds"],
                             whole_probe_seconds=run["probe_seconds"])
    for contender in ("floor", "xbench"):
        by[contender]["whole_vs_floor"] = (by[contender]["whole_tokens_per_sec"]
                                           / by["floor"]["whole_tokens_per_sec"])


def main() -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES),
                        default=["d1024-L12"] if cuda else ["default", "d256-L4", "d512-L8"])
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per contender")
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--precision", default="bf16-mixed" if cuda else "32-true")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile every contender (inductor; trainer.compile=true)")
    parser.add_argument("--whole-run-seconds", type=float, default=0 if cuda else 60,
                        help="CPU: about this much training per whole run (0: none)")
    parser.add_argument("--out", type=Path, default=Path("results/bench/train"))
    args = parser.parse_args()

    rows = []
    for size in args.sizes:
        rows += as_rows(race(size, args.steps, args.device, args.precision,
                             tuple(args.contenders), args.compile))
        if args.whole_run_seconds and args.device == "cpu" and not args.compile:
            add_whole_runs(rows[-len(args.contenders):], size, args.whole_run_seconds)
        print(json.dumps(rows[-len(args.contenders):]), flush=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() \
        or platform.machine()
    setting = (f"{args.device} ({device}, {torch.get_num_threads()} threads), {args.precision}, "
               f"{'compiled (inductor)' if args.compile else 'eager'}, "
               f"{args.steps} timed steps, torch {torch.__version__}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(markdown(rows, setting))
    args.out.with_suffix(".json").write_text(json.dumps({"setting": setting, "rows": rows},
                                                        indent=1))
    print(markdown(rows, setting))


if __name__ == "__main__":
    main()
