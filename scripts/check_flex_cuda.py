"""FlexAttention against the hand-written sparse kernels and full SDPA (:mod:`xformer_bench.attention._ops.flex`).

Per pattern at its YAML defaults (causal) and length: the max abs error of flex against the
hand-written kernel (forward and q/k/v gradients; on CPU forward only, flex has no CPU
backward), then forward + backward time (synchronised, one warm-up -- flex's compile -- then best
of 3) and peak memory above the inputs for flex, hand-written and full causal
``scaled_dot_product_attention`` (FlashAttention in bf16).  Hand-written is skipped where its
time or memory, extrapolated quadratically from the previous length, passes the caps.
Writes <out>.json and <out>.md.  Example: ``python scripts/check_flex_cuda.py --out /tmp/flex``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from xformer_bench.attention._ops import flex as _flex
from xformer_bench.bench.peak_memory import peak_bytes
from xformer_bench.config import compose_config
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION, DESCRIPTIVE_KEYS

PATTERNS = ("local", "block_local", "dilated", "strided", "fixed", "longformer", "bigbird")
CAP_SECONDS, CAP_MIB = 5.0, 20 * 1024


def kernel_at_defaults(name: str, heads: int, head_dim: int, length: int, device):
    spec = compose_config(f"attention={name}")["attention"]
    kwargs = {k: v for k, v in spec.items() if k not in DESCRIPTIVE_KEYS}
    dims = ModelDims(d_model=heads * head_dim, n_heads=heads, n_layers=2,
                     d_ff=4 * heads * head_dim, seq_len=length, vocab_size=256)
    return ATTENTION.get(name)(dims, **kwargs).to(device)


def measure(run, inputs, backward: bool, device) -> dict:
    """Output and grads of one pass, then best-of-3 ms and peak MiB of forward (+ backward)."""
    def step():
        for x in inputs:
            x.grad = None
        with torch.set_grad_enabled(backward):
            out = run(*inputs)
            if backward:
                out.float().sum().backward()
        return out

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = time.perf_counter()
    out = step()  # warm-up: compile, block mask, allocator
    sync()
    first = time.perf_counter() - started
    result = [out.detach(), *(x.grad for x in inputs)] if backward else [out.detach()]
    times = []
    for _ in range(3):
        sync()
        started = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - started)
    # on CPU peak_bytes watches dispatch, which flex's operator does not take: CUDA only
    mib = peak_bytes(step, device) / 2**20 if device.type == "cuda" else None
    return {"ms": 1e3 * min(times), "first_s": first, "result": result, "mib": mib}


def max_error(a: list, b: list) -> list[float]:
    return [(x.float() - y.float()).abs().max().item() for x, y in zip(a, b)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--out", default="flex_check")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    backward = device.type == "cuda"
    rows, started = [], time.perf_counter()

    def inputs_of(length):
        g = torch.Generator().manual_seed(0)
        return [torch.randn(args.batch, args.heads, length, args.head_dim, generator=g)
                .to(device, dtype).requires_grad_(backward) for _ in range(3)]

    full = {}
    for length in args.lengths:
        try:
            sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
            full[length] = measure(sdpa, inputs_of(length), backward, device)
        except Exception as error:  # noqa: BLE001 -- recorded, the sweep goes on
            full[length] = {"error": str(error).splitlines()[0][:200]}
    for name in PATTERNS:
        previous = None  # (length, hand-written ms, MiB)
        for length in args.lengths:
            row = {"pattern": name, "T": length, "dtype": args.dtype, "device": str(device),
                   "sdpa_full_ms": full[length].get("ms"), "sdpa_full_mib": full[length].get("mib")}
            kernel = kernel_at_defaults(name, args.heads, args.head_dim, length, device)
            results = {}
            for path, force in (("flex", True), ("hand", False)):
                growth = (length / previous[0]) ** 2 if previous else 0
                if path == "hand" and previous and (previous[1] * growth > 1e3 * CAP_SECONDS
                                                    or previous[2] * growth > CAP_MIB):
                    row["hand_error"] = "skipped: extrapolated past 5 s or 20 GiB"
                    continue
                _flex.FORCE = force
                run = lambda q, k, v: kernel(q, k, v, causal=True, layer=1)  # noqa: E731
                try:
                    m = measure(run, inputs_of(length), backward, device)
                except Exception as error:  # noqa: BLE001 -- recorded, the sweep goes on
                    row[f"{path}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                    continue
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                results[path] = m["result"]
                row.update({f"{path}_ms": m["ms"], f"{path}_mib": m["mib"],
                            f"{path}_first_s": m["first_s"]})
                if path == "hand":
                    previous = (length, m["ms"], m["mib"] or 0.0)
            _flex.FORCE = None
            if len(results) == 2:
                errors = max_error(results["flex"], results["hand"])
                row["max_error_fwd"], row["max_error_bwd"] = errors[0], max(errors[1:], default=None)
                row["max_abs_hand"] = [x.abs().max().item() for x in results["hand"]]  # scales
            rows.append(row)
            print(f"[{time.perf_counter() - started:6.1f}s] {name:>11} T={length:>6}: "
                  + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in row.items()
                              if k not in ("pattern", "T", "dtype", "device", "max_abs_hand")),
                  flush=True)
    write(rows, full, args, device, backward)


def write(rows, full, args, device, backward) -> None:
    stem = Path(args.out)
    stem.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "dtype": args.dtype, "batch": args.batch,
            "heads": args.heads, "head_dim": args.head_dim, "backward": backward,
            "sdpa_errors": {n: f["error"] for n, f in full.items() if "error" in f}}
    Path(f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    fmt = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    ratio = lambda a, b: "-" if a is None or b is None else f"{b / a:.2f}x"  # noqa: E731
    what = "fwd+bwd" if backward else "fwd only"
    lines = [f"FlexAttention check on {meta['device']} (torch {meta['torch']}, {args.dtype}, "
             f"B={args.batch} H={args.heads} Dh={args.head_dim}, causal, {what}; ms best of 3, "
             "MiB peak above inputs, CUDA only; speed-up = other ms / flex ms; errors: max abs, flex "
             "vs hand, of out and of the q/k/v grads of out.sum(), whose scale is in the json)", "",
             "| pattern | T | flex ms | hand ms | SDPA-full ms | flex vs hand | flex vs full "
             "| flex MiB | hand MiB | full MiB | err fwd | err bwd | notes |",
             "|" + "---|" * 13]
    for r in rows:
        notes = "; ".join(r[k] for k in ("flex_error", "hand_error") if k in r)
        lines.append(
            f"| {r['pattern']} | {r['T']} | {fmt(r.get('flex_ms'))} | {fmt(r.get('hand_ms'))} "
            f"| {fmt(r.get('sdpa_full_ms'))} | {ratio(r.get('flex_ms'), r.get('hand_ms'))} "
            f"| {ratio(r.get('flex_ms'), r.get('sdpa_full_ms'))} | {fmt(r.get('flex_mib'), 1)} "
            f"| {fmt(r.get('hand_mib'), 1)} | {fmt(r.get('sdpa_full_mib'), 1)} "
            f"| {fmt(r.get('max_error_fwd'), 6)} | {fmt(r.get('max_error_bwd'), 6)} | {notes} |")
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json and {stem}.md", flush=True)


if __name__ == "__main__":
    main()
