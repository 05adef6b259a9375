"""Training throughput of a configuration, without validation or logging.

    python scripts/benchmark_throughput.py model.d_model=512 model.n_layers=8 \
        model.n_heads=8 model.d_ff=2048 data.seq_len=512 data.batch_size=8 --steps 10

Composes the config exactly as `xbench` does (same overrides), builds the model, and times
forward + backward + AdamW steps on random bytes after warm-up steps.  Prints one JSON line:
steps/s, tokens/s, parameters, FLOPs per step and the achieved FLOP/s.  On CUDA,
`--bf16` runs under bf16 autocast and `--compile` uses torch.compile.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from xformer_bench.config import compose_config
from xformer_bench.models.build import build_model
from xformer_bench.models.flops import training_step_flops
from xformer_bench.core.step_updates import apply_pending_updates, prepare_training_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="xbench overrides, e.g. model.d_model=512")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()

    config = compose_config(*args.overrides)
    seq_len, batch = config["data"]["seq_len"], config["data"]["batch_size"]
    torch.manual_seed(config["seed"])
    model = build_model(config, vocab_size=256).to(args.device)
    flops = training_step_flops(model, seq_len, batch)
    step_model = torch.compile(model) if args.compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["optim"]["lr"])
    tokens = torch.randint(0, 256, (batch, seq_len + 1), device=args.device)

    def step() -> None:
        prepare_training_step(model)  # as the Task: Performer's redraw before the batch
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.bf16):
            log_p = step_model(tokens[:, :-1])  # (B, T, V)
        F.nll_loss(log_p.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        optimizer.step()
        apply_pending_updates(model)  # as Task.optimizer_step: routing's centroids move
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = time.perf_counter() - started
    steps_per_sec = args.steps / seconds
    print(json.dumps({
        "overrides": args.overrides, "device": args.device, "bf16": args.bf16,
        "compile": args.compile, "threads": torch.get_num_threads(),
        "params": model.num_parameters(), "flops_per_step": flops,
        "steps_per_sec": round(steps_per_sec, 3),
        "tokens_per_sec": round(steps_per_sec * batch * seq_len),
        "tflops_per_sec": round(steps_per_sec * flops / 1e12, 4),
    }))


if __name__ == "__main__":
    main()
