"""The training race: xbench's real training path against a hand-written loop over the same
model (the floor) and x-transformers' ``TransformerWrapper``, at identical shapes.

* ``xbench``: ``model=vanilla`` run by :func:`xformer_bench.run.execute` -- Lightning, the task,
  every callback, the step-indexed data -- timed by its own :class:`Throughput` (training steps
  only, the first left out).
* ``floor``: the same model (``build_model``, same seed) in a plain loop: forward, cross-entropy,
  backward, gradient clipping at 1, AdamW, ``zero_grad(set_to_none=True)``, on batches made
  before timing.  What any runner must cost at least.
* ``x_transformers``: ``TransformerWrapper(num_tokens=256, max_seq_len=T,
  attn_layers=Decoder(dim, depth, heads, attn_dim_head=dim/heads, ff_mult=d_ff/dim))`` in the
  same loop (optional: ``pip install x-transformers``).

To compare like with like, the xbench model is configured as x-transformers builds its
decoder: learned absolute positions, untied input and output embeddings, GELU, pre-LN; the
parameter counts are reported (within 2 %).  Each contender reports tokens/s, ms per step,
the activation memory of one training step (the allocation tracker on CPU, the CUDA peak on
GPU) and, on CUDA, model FLOPs utilisation against the device's dense bf16 peak.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.core.step_updates import apply_pending_updates

CONTENDERS = ("xbench", "floor", "x_transformers")
SIZES = {
    "default": dict(d_model=128, n_layers=4, n_heads=4, d_ff=512, seq_len=128, batch=16),
    "d256-L4": dict(d_model=256, n_layers=4, n_heads=4, d_ff=1024, seq_len=256, batch=16),
    "d512-L8": dict(d_model=512, n_layers=8, n_heads=8, d_ff=2048, seq_len=512, batch=8),
    "d1024-L12": dict(d_model=1024, n_layers=12, n_heads=16, d_ff=4096, seq_len=2048, batch=8),
}
"""The issue's sizes; the last is for GPUs only."""
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
"""Dense bf16 tensor-core peaks (NVIDIA data sheets) for model FLOPs utilisation."""


@dataclass
class Result:
    contender: str
    size: str
    params: int
    tokens_per_sec: float
    ms_per_step: float
    step_memory_mib: float
    mfu: float | None


def overrides_for(size: dict, steps: int, device: str, precision: str,
                  compiled: bool = False) -> list[str]:
    """The xbench command line of one size, configured as x-transformers builds its decoder."""
    return [f"trainer.compile={str(compiled).lower()}",
        "model=vanilla", "position=learned", "activation=gelu", "head.tie=false",
        f"model.d_model={size['d_model']}", f"model.n_layers={size['n_layers']}",
        f"model.n_heads={size['n_heads']}", f"model.d_ff={size['d_ff']}",
        "data=synthetic", f"data.seq_len={size['seq_len']}", f"data.batch_size={size['batch']}",
        f"data.size={max(200_000, 4 * size['seq_len'] * size['batch'])}",
        f"trainer.max_steps={steps}", "trainer.val_checks=1", "trainer.limit_val_batches=1",
        f"trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}",
        f"trainer.precision={precision}", "trainer.progress_bar=false", "logger=none",
    ]


def x_transformers_model(size: dict, device: str = "cpu") -> nn.Module:
    """On CUDA with ``attn_flash=True`` (SDPA's fused kernels, as xbench's ``full``): its
    default materialises the T x T scores -- 74 GB and 0.19x the floor at d1024-L12 on an H200.
    On CPU its default, as the shipped CPU table measured it."""
    from x_transformers import Decoder, TransformerWrapper

    return TransformerWrapper(
        num_tokens=256, max_seq_len=size["seq_len"],
        attn_layers=Decoder(dim=size["d_model"], depth=size["n_layers"], heads=size["n_heads"],
                            attn_dim_head=size["d_model"] // size["n_heads"],
                            ff_mult=size["d_ff"] / size["d_model"],
                            attn_flash=device == "cuda"))


def _mfu(flops_per_step: float, seconds_per_step: float, device: str) -> float | None:
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    return None if peak is None else flops_per_step / seconds_per_step / peak


def hand_loop(model: nn.Module, size: dict, steps: int, warmup: int, device: str,
              precision: str, lr: float = 3e-3) -> tuple[float, float]:
    """(tokens/s, peak step MiB on CUDA or NaN) of the plain training loop over ``model``."""
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98),
                                  fused=device == "cuda")
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (size["batch"], size["seq_len"] + 1),
                             generator=generator).to(device) for _ in range(4)]
    bf16 = precision.startswith("bf16")

    def step(tokens: torch.Tensor) -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        apply_pending_updates(model)  # as Task.optimizer_step: routing's centroids move
        optimizer.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for i in range(warmup):
        step(batches[i % len(batches)])
    sync()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for i in range(steps):
        step(batches[i % len(batches)])
    sync()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else float("nan")
    return steps * size["batch"] * size["seq_len"] / seconds, peak


def _step_memory(model: nn.Module, size: dict) -> float:
    from xformer_bench.training.step_memory import training_step_memory

    return training_step_memory(model, size["seq_len"], size["batch"], 256)


def race_xbench(name: str, size: dict, steps: int, device: str, precision: str,
                compiled: bool = False) -> Result:
    from xformer_bench.config import choice_groups, compose_config
    from xformer_bench.run import execute

    with tempfile.TemporaryDirectory() as folder:
        overrides = [*overrides_for(size, steps + 1, device, precision, compiled),
                     f"paths.results_dir={folder}"]
        config = compose_config(*overrides)
        choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
        record = execute(config, choices, overrides, Path(folder) / "run")
    memory = (record["peak_memory_mb"] if device == "cuda" else record["step_memory_mb"])
    seconds = 1.0 / record["steps_per_sec"]
    return Result("xbench", name, record["params"], record["tokens_per_sec"], 1000 * seconds,
                  memory, _mfu(record["flops_per_step"], seconds, device))


def race_module(contender: str, name: str, size: dict, steps: int, device: str,
                precision: str, seed: int = 0, compiled: bool = False) -> Result:
    """The floor (xbench's model in the plain loop) or x-transformers' model in it; compiled:
    ``Module.compile`` (inductor) after counting, as ``trainer.compile=true`` does for xbench.
    MFU counts the floor's FLOPs for both: the shapes are the same, and the counter misses
    x-transformers' flash attention (on an H200 its MFU read 26.5 % at 0.84x the floor's speed)."""
    from xformer_bench.config import compose_config
    from xformer_bench.models.build import build_model
    from xformer_bench.models.flops import training_step_flops

    torch.manual_seed(seed)
    floor = build_model(compose_config(*overrides_for(size, steps, device, precision)),
                        vocab_size=256)
    model = floor if contender == "floor" else x_transformers_model(size, device)
    params = sum(p.numel() for p in model.parameters())
    memory = _step_memory(model, size) if device != "cuda" else float("nan")
    flops = training_step_flops(floor, size["seq_len"], size["batch"]).total \
        if device == "cuda" else 0.0
    del floor
    if compiled:
        model.compile()
    tokens_per_sec, cuda_peak = hand_loop(model, size, steps, warmup=2, device=device,
                                          precision=precision)
    seconds = size["batch"] * size["seq_len"] / tokens_per_sec
    return Result(contender, name, params, tokens_per_sec, 1000 * seconds,
                  cuda_peak if device == "cuda" else memory, _mfu(flops, seconds, device))


def race(name: str, steps: int, device: str, precision: str,
         contenders: tuple[str, ...] = CONTENDERS, compiled: bool = False) -> list[Result]:
    """Every contender at one size, one after another in this process (compiled: each one
    through torch.compile, its compilation in the untimed warm-up)."""
    size = SIZES[name]
    results = []
    for contender in contenders:
        if contender == "xbench":
            results.append(race_xbench(name, size, steps, device, precision, compiled))
        else:
            results.append(race_module(contender, name, size, steps, device, precision,
                                       compiled=compiled))
    return results


def as_rows(results: list[Result]) -> list[dict]:
    """Results with each one's speed relative to the floor and to x-transformers of its size."""
    rows = []
    for result in results:
        peers = {r.contender: r for r in results if r.size == result.size}
        row = asdict(result)
        for peer in ("floor", "x_transformers"):
            row[f"vs_{peer}"] = (result.tokens_per_sec / peers[peer].tokens_per_sec
                                 if peer in peers else None)
        rows.append(row)
    return rows
