"""The cost of decoding: time per generated token and the memory a causal LM keeps, against the
number of tokens generated so far (a recurrent mixer decodes in O(1) time and memory
per token, full attention with a key/value cache in O(S)).

For each option of the ``attention`` group, a causal LM of the given sizes (weights at their
initialisation: the cost does not depend on them) generates greedily, one token a step, through
:class:`xformer_bench.sample.Decoder` -- :meth:`TransformerLM.decode` with a
:class:`~xformer_bench.core.decode_cache.DecodeCache`, the path ``xbench-sample`` takes.  At each
length L it reports the median time of the ``timed`` steps ending at L, the bytes the cache holds
at L (each storage once) and the peak a decoding step at L allocates beyond them
(:mod:`xformer_bench.bench.peak_memory`).  A model the cache cannot serve is reported ``n/a``
with the reason, never decoded by recomputing the window.  :func:`state_growth` holds every
option whose mixers all declare a ``recurrent`` state to a cache that does not grow.
"""

from __future__ import annotations

import csv
import io
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from xformer_bench.bench.length_table import Measure, length_table
from xformer_bench.bench.peak_memory import peak_bytes
from xformer_bench.core.decode_cache import DecodeCache
from xformer_bench.results.table import Table
from xformer_bench.sample import Decoder

REFERENCE = "full"
MB = 2 ** 20


@dataclass(frozen=True)
class DecodeShape:
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 4
    batch: int = 1
    timed: int = 32       # decoding steps timed per length (their median is reported)
    dtype: str = "fp32"   # fp32 | bf16 (the model's weights and cache)


@dataclass(frozen=True)
class DecodePoint:
    attention: str
    length: int                    # tokens in the sequence after the timed steps
    ms_per_token: float | None = None
    cache_mb: float | None = None  # what the decode cache holds at this length
    step_mb: float | None = None   # peak one decoding step allocates at this length
    status: str = "ok"             # ok | n/a (why) | error (what)
    decode_state: str = ""         # what the mixers keep: recurrent, keys_values, or a mix "a+b"


def lm_config(name: str, shape: DecodeShape, max_length: int) -> dict:
    """The composed config of a causal byte LM with attention ``name`` at ``shape``."""
    from xformer_bench.config import compose_config

    return compose_config(f"attention={name}", f"model.d_model={shape.d_model}",
                          f"model.n_heads={shape.n_heads}", f"model.n_layers={shape.n_layers}",
                          f"model.d_ff={4 * shape.d_model}", f"data.seq_len={max_length}")


def build_lm(name: str, shape: DecodeShape, max_length: int, device: torch.device) -> nn.Module:
    from xformer_bench.models.build import build_model

    torch.manual_seed(0)
    model = build_model(lm_config(name, shape, max_length), vocab_size=256)
    dtype = torch.bfloat16 if shape.dtype == "bf16" else torch.float32
    return model.to(device=device, dtype=dtype).eval()


def cache_bytes(cache: DecodeCache | None) -> int:
    """Bytes of the tensors the cache's slots hold, each storage once."""
    seen: dict[int, int] = {}

    def visit(value) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    for slot in cache.slots if cache is not None else ():
        visit(slot)
    return sum(seen.values())


def decode_points(model: nn.Module, name: str, lengths: list[int], shape: DecodeShape,
                  device: torch.device, progress: Callable[[DecodePoint], None] = lambda p: None
                  ) -> list[DecodePoint]:
    """Greedy decoding from one token to ``max(lengths)``, measured at each length (each
    point shown to ``progress`` as it is measured)."""
    lengths = sorted(lengths)
    state = decode_states(model)
    decoder = Decoder(model, window=lengths[-1] + 1)
    if decoder.cache is None:
        return [DecodePoint(name, n, status=f"n/a (no cache: {decoder.blocker})",
                            decode_state=state) for n in lengths]
    tokens = torch.zeros(shape.batch, lengths[-1] + 1, dtype=torch.long, device=device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    filled = 1  # the prompt: token 0

    def step() -> None:
        nonlocal filled
        tokens[:, filled] = decoder.next_logprobs(tokens[:, :filled]).argmax(-1)
        filled += 1

    points = []
    for length in lengths:
        while filled < length - shape.timed:
            step()
        times = []
        while filled < length:
            sync()
            started = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - started)
        seconds = statistics.median(times)  # robust to a step that shared the machine
        held = cache_bytes(decoder.cache)
        peak = peak_bytes(step, device)  # one step more, untimed
        points.append(DecodePoint(name, length, 1e3 * seconds, held / MB, peak / MB,
                                  decode_state=state))
        progress(points[-1])
    return points


def check_lengths(lengths: list[int], timed: int) -> None:
    """Each length leaves room for its timed steps after the one before it (ValueError)."""
    previous = 1
    for length in sorted(lengths):
        if length - timed < previous + 1:
            raise ValueError(f"length {length} leaves no room for {timed} timed steps after "
                             f"{previous}: space the lengths by more than --timed")
        previous = length + 1  # the peak-memory step decodes one token more


def sweep(names: Iterable[str], lengths: list[int], shape: DecodeShape, device: torch.device,
          progress: Callable[[str], None] = print,
          build: Callable[..., nn.Module] = build_lm) -> list[DecodePoint]:
    """Every option at every length; one that cannot be built or decoded is a status."""
    check_lengths(lengths, shape.timed)
    results = []
    for name in names:
        def show(p: DecodePoint) -> None:
            progress(f"{name:>14} L={p.length:>6}: {p.ms_per_token:8.2f} ms/token, "
                     f"cache {p.cache_mb:9.3f} MB, step {p.step_mb:8.3f} MB")

        try:
            points = decode_points(build(name, shape, max(lengths) + 2, device), name, lengths,
                                   shape, device, show)
        except (ValueError, RuntimeError) as error:  # ConfigError is a ValueError
            text = (str(error).splitlines() or [type(error).__name__])[0][:60]
            points = [DecodePoint(name, n, status=f"error ({text})") for n in sorted(lengths)]
        results += points
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def decode_states(model: nn.Module) -> str:
    """What the blocks' token mixers declare they keep (``decode_state``), "a+b" for a mix."""
    states = [getattr(block.attention, "decode_state", "none") for block in model.stack.blocks]
    return "+".join(dict.fromkeys(states))


def state_growth(points: list[DecodePoint]) -> list[str]:
    """One line per option whose mixers all keep a ``recurrent`` state but whose cache grew
    from its first measured length to its last: a recurrent state is a fixed size."""
    problems = []
    for name in dict.fromkeys(p.attention for p in points if p.decode_state == "recurrent"):
        ok = [p for p in points if p.attention == name and p.status == "ok"]
        if len(ok) >= 2 and ok[-1].cache_mb > ok[0].cache_mb:
            problems.append(f"attention={name} declares a recurrent decode state, but its cache "
                            f"grew from {ok[0].cache_mb * MB:.0f} bytes at {ok[0].length} tokens "
                            f"to {ok[-1].cache_mb * MB:.0f} at {ok[-1].length}")
    return problems


def table(points: list[DecodePoint], shape: DecodeShape, device: str) -> Table:
    """A row per option: ms per token and cache MB per length, with ratios to ``full``."""
    columns, rows = length_table(points, (Measure("ms_per_token", "ms", "ms/token", 2),
                                          Measure("cache_mb", "cache", "cache MB", 3)),
                                 REFERENCE, "L")
    note = (f"Decoding cost on {device}: a causal byte LM ({shape.n_layers} layers, d_model "
            f"{shape.d_model}, {shape.n_heads} heads, {shape.dtype}, batch {shape.batch}) "
            f"generating greedily through the decode cache; ms per token (median of the "
            f"{shape.timed} steps ending at L; ratio to {REFERENCE}) and the MB the cache holds "
            f"at L (ratio to {REFERENCE}); n/a: the model cannot decode with a cache.")
    return Table(experiment="decode_cost", columns=columns, rows=rows,
                 loss_data="", note=note)


CSV_FIELDS = [f.name for f in fields(DecodePoint)]


def to_csv(points: list[DecodePoint]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for p in points:
        writer.writerow(asdict(p))
    return out.getvalue()
