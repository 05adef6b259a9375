"""The cost of every attention: forward + backward time and peak memory against length.

For each option of the ``attention`` group (at its YAML defaults, through the same
:func:`~xformer_bench.models.token_mixer.build_token_mixer` a model uses: projections
included, identical for all) and each length T, it times forward + backward of one layer on
a (batch, T, heads x head_dim) input and measures the peak memory that pass allocates
(:mod:`xformer_bench.bench.peak_memory`).  A variant stops at the first length whose
extrapolated time or memory (from the growth it showed so far) passes the caps, and the table
says so.  The table has the shape of Long Range Arena's Table 2 (Tay et al. 2021): steps per
second and speed-up over ``full``, peak memory and its ratio to ``full``, per length.
"""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

from xformer_bench.bench.length_table import Measure, length_table
from xformer_bench.bench.peak_memory import peak_bytes
from xformer_bench.config import compose_config
from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.position import Position
from xformer_bench.results.table import Table

REFERENCE = "full"


@dataclass(frozen=True)
class Shape:
    batch: int = 1
    heads: int = 4
    head_dim: int = 64
    causal: bool = True
    scope: str = "layer"  # layer: the whole sublayer | kernel: q, k, v -> out where there is one
    dtype: str = "fp32"  # fp32 | bf16 (autocast, as bf16-mixed training runs it)
    compiled: bool = False  # torch.compile (inductor) the layer; compiled in the warm-up pass


@dataclass(frozen=True)
class Caps:
    seconds: float = 30.0  # one forward + backward
    megabytes: float = 8192.0


@dataclass(frozen=True)
class Measurement:
    attention: str
    length: int
    seconds: float | None = None  # fastest of the repeats
    peak_mb: float | None = None
    status: str = "ok"  # ok | cap | n/a (the option cannot run this shape) | error text

    @property
    def steps_per_sec(self) -> float | None:
        return 1.0 / self.seconds if self.seconds else None


def build_layer(name: str, length: int, shape: Shape, device: torch.device):
    spec = compose_config(f"attention={name}")["attention"]
    dims = ModelDims(d_model=shape.heads * shape.head_dim, n_heads=shape.heads, n_layers=2,
                     d_ff=4 * shape.heads * shape.head_dim, seq_len=length, vocab_size=256)
    torch.manual_seed(0)
    return build_token_mixer(spec, dims).to(device)


def measure(name: str, length: int, shape: Shape, device: torch.device,
            repeats: int = 3) -> Measurement:
    layer = build_layer(name, length, shape, device)
    mode = "causal" if shape.causal else "bidirectional"
    if mode not in layer.provides:
        return Measurement(name, length, status=f"n/a ({mode})")
    if shape.compiled:
        layer.compile()
    ctx = ForwardContext(Position(), causal=shape.causal, layer=1)
    kernel = getattr(layer, "kernel", None) if shape.scope == "kernel" else None
    if kernel is not None:  # (B, H, T, Dh) queries, keys and values straight into the kernel
        inputs = [torch.randn(shape.batch, shape.heads, length, shape.head_dim, device=device,
                              requires_grad=True) for _ in range(3)]
        run = lambda: kernel(*inputs, causal=shape.causal, layer=1)  # noqa: E731
    else:
        inputs = [torch.randn(shape.batch, length, shape.heads * shape.head_dim, device=device,
                              requires_grad=True)]  # (B, T, D)
        run = lambda: layer(inputs[0], ctx)  # noqa: E731

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=shape.dtype == "bf16"):
            out = run()
        out.float().sum().backward()
        for tensor in inputs:
            tensor.grad = None
        layer.zero_grad(set_to_none=True)

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    step()  # warm-up: lazy tables, allocator
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - started)
    peak = peak_bytes(step, device) / 2**20
    return Measurement(name, length, min(times), peak)


def _extrapolate(points: list[tuple[int, float]], length: int) -> float:
    """The next value from the growth exponent of the last two points (between 1 and 2)."""
    if len(points) < 2:
        (n, value), = points
        return value * (length / n) ** 2
    (n1, v1), (n2, v2) = points[-2:]
    exponent = min(2.0, max(1.0, math.log(max(v2, 1e-12) / max(v1, 1e-12)) / math.log(n2 / n1)))
    return v2 * (length / n2) ** exponent


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:60]


def sweep(names: Iterable[str], lengths: list[int], shape: Shape, caps: Caps,
          device: torch.device, repeats: int = 3, progress=print,
          on_result=None) -> list[Measurement]:
    """Every (attention, length), shortest first, each attention stopped past the caps; an
    option that runs out of memory or fails on the device is recorded with its status, and the
    sweep goes on.  ``on_result`` sees each measurement as it is made (a partial CSV)."""
    results = []
    for name in names:
        timed: list[tuple[int, float]] = []
        memory: list[tuple[int, float]] = []
        stopped = None
        for length in lengths:
            if stopped is None and timed and (
                    _extrapolate(timed, length) > caps.seconds
                    or _extrapolate(memory, length) > caps.megabytes):
                stopped = "cap"
            if stopped is not None:
                results.append(Measurement(name, length, status=stopped))
                continue
            try:
                m = measure(name, length, shape, device, repeats)
            except (ConfigError, ValueError) as error:  # a shape the option refuses
                m = Measurement(name, length, status=f"n/a ({_first_line(error)})")
            except torch.OutOfMemoryError:
                m = Measurement(name, length, status="out of memory")
            except RuntimeError as error:  # a kernel that fails on this device or dtype: said
                m = Measurement(name, length, status=f"error ({_first_line(error)})")
            if device.type == "cuda":
                torch.cuda.empty_cache()
            results.append(m)
            if on_result is not None:
                on_result(m)
            if m.status != "ok":
                stopped = m.status
                continue
            timed.append((length, m.seconds))
            memory.append((length, max(m.peak_mb, 1e-3)))
            progress(f"{name:>14} T={length:>6}: {m.seconds * 1e3:9.1f} ms, {m.peak_mb:9.1f} MB")
    return results


def table(results: list[Measurement], shape: Shape, device: str) -> Table:
    """LRA Table 2's shape: a row per attention, steps/s and peak memory per length."""
    columns, rows = length_table(results, (Measure("steps_per_sec", "steps", "steps/s", 2),
                                           Measure("peak_mb", "memory", "MB", 1)), REFERENCE, "T")
    mode = "causal" if shape.causal else "bidirectional"
    what = ("layer (projections included)" if shape.scope == "layer" else
            "kernel (q, k, v -> out; token mixers without a kernel: their whole layer)")
    precision = "bf16 autocast" if shape.dtype == "bf16" else "fp32"
    note = (f"Attention cost on {device}: one {mode} {what}, forward + "
            f"backward in {precision}, batch {shape.batch}, {shape.heads} heads of {shape.head_dim}; steps/s "
            f"(speed-up over {REFERENCE}) and peak memory allocated in MB (ratio to {REFERENCE}); "
            "cap: stopped where time or memory would pass the caps; n/a: the option does not "
            "run this shape.")
    return Table(experiment=f"attention_cost_{shape.scope}", columns=columns, rows=rows,
                 loss_data="", note=note)


CSV_FIELDS = ["attention", "length", "seconds", "steps_per_sec", "peak_mb", "status"]


def csv_row(m: Measurement) -> dict:
    return {**asdict(m), "steps_per_sec": m.steps_per_sec}


def to_csv(results: list[Measurement]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for m in results:
        writer.writerow(csv_row(m))
    return out.getvalue()


def from_csv(text: str) -> list[Measurement]:
    """Measurements back from :func:`to_csv`'s text (to re-render without re-measuring)."""
    number = lambda v: float(v) if v not in ("", None) else None  # noqa: E731
    return [Measurement(r["attention"], int(r["length"]), number(r["seconds"]),
                        number(r["peak_mb"]), r["status"])
            for r in csv.DictReader(io.StringIO(text))]


def plot(results: list[Measurement], path_stem) -> list:
    """Log-log time and memory against T, one line per attention; PNG and PDF."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4))
    axes = figure.subplots(1, 2)
    names = list(dict.fromkeys(m.attention for m in results))
    styles = ["-", "--", "-.", ":"]
    for i, name in enumerate(names):
        ok = [m for m in results if m.attention == name and m.status == "ok"]
        if not ok:
            continue
        lengths = [m.length for m in ok]
        style = dict(marker="o", linestyle=styles[i % len(styles)], label=name,
                     color=matplotlib.colormaps["tab20"](i % 20))
        axes[0].plot(lengths, [m.seconds for m in ok], **style)
        axes[1].plot(lengths, [m.peak_mb for m in ok], **style)
    for ax, title in zip(axes, ("forward + backward (s)", "peak memory (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    figure.tight_layout()
    paths = []
    for suffix in (".png", ".pdf"):
        path = path_stem.with_suffix(suffix)
        figure.savefig(path, dpi=120)
        paths.append(path)
    return paths
