"""Shared test set-up: offline, CPU, small sizes, configs composed as the CLI does."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from pathlib import Path

os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", XBENCH_OFFLINE="1",
                  WANDB_MODE="offline", WANDB_SILENT="true", TOKENIZERS_PARALLELISM="false",
                  OMP_NUM_THREADS="1")  # tiny models: threads only add contention

import pytest  # noqa: E402
import torch  # noqa: E402

__import__("lightning")  # its log handler binds to the session's stream here, not to the
# stream of whichever test's capsys happens to import it first (closed after that test)

from xformer_bench import config as config_module  # noqa: E402
from xformer_bench.config import choice_groups  # noqa: E402,F401 -- tests import it
from xformer_bench.core.dims import ModelDims  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def tiny_dims() -> ModelDims:
    return ModelDims(d_model=32, n_heads=4, n_layers=2, d_ff=64, seq_len=16, vocab_size=256)


@functools.lru_cache(maxsize=1024)
def _composed(overrides: tuple[str, ...], conf_dir: str, data_dir: str | None) -> dict:
    return config_module.compose_config(*overrides)


def compose_config(*overrides: str) -> dict:
    """The CLI's config for ``overrides`` (:func:`xformer_bench.config.compose_config`), composed
    once per session for each override list, config folder and data directory -- Hydra re-reads
    every YAML at each compose -- and handed out as a fresh copy each time."""
    key = (tuple(overrides), str(config_module.CONF_DIR), os.environ.get("XBENCH_DATA_DIR"))
    return copy.deepcopy(_composed(*key))


TINY_RUN = ("data.size=20000", "data.seq_len=32", "data.batch_size=4", "data.eval_batch_size=16",
            "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.d_ff=64",
            "trainer.max_steps=16", "optim.warmup_steps=2", "trainer.progress_bar=false",
            "logger=none")


def run_tiny(tmp_path, *overrides: str) -> dict:
    """Train a tiny model in-process, as `xbench` would, with records under tmp_path."""
    from xformer_bench.run import execute

    overrides = (*TINY_RUN, f"paths.results_dir={tmp_path / 'results'}", *overrides)
    config = compose_config(*overrides)
    choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
    return execute(config, choices, list(overrides), tmp_path / "run")


XBENCH = [sys.executable, "-m", "xformer_bench.cli"]


def xbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`xbench ARGS` as a user runs it, in ``cwd``, with datasets looked for in cwd/data."""
    env = dict(os.environ, XBENCH_DATA_DIR=str(cwd / "data"))
    return subprocess.run([*XBENCH, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def declared_refusals(config: dict) -> list[str]:
    """What the parts of ``config``, each built on its own, declare impossible together: the
    generic tests' source of which combinations must be refused (one ConfigError line)."""
    from xformer_bench.models.capabilities import unmet
    from xformer_bench.models.body import build_mixer, model_parts
    from xformer_bench.registry import FFN, NORM, POSITION, STACK

    m = config["model"]
    dims = ModelDims(d_model=m["d_model"], n_heads=m["n_heads"], n_layers=m["n_layers"],
                     d_ff=m["d_ff"], seq_len=config["data"]["seq_len"], vocab_size=256)
    modules = {
        "attention": build_mixer(config["attention"], dims, m["residual_attention"]),
        "position": POSITION.build(config["position"], dims=dims),
        "norm": NORM.build(config["norm"], dim=dims.d_model),
        "ffn": FFN.build(config["ffn"], dims=dims, activation=config["activation"]),
        "stack": STACK.get(config["stack"]["name"]),  # a stack's needs are class attributes
    }
    return unmet(model_parts(config, modules, m)) + _vocabulary_refusals(config, dims)


def _vocabulary_refusals(config: dict, dims: ModelDims) -> list[str]:
    """What the embedding and the output head, built on their own, refuse together (a tied
    head whose tables the embedding does not have): its one ConfigError line, if any."""
    from xformer_bench.errors import ConfigError
    from xformer_bench.registry import EMBEDDING, HEAD

    embedding = EMBEDDING.build(config["embedding"], vocab_size=dims.vocab_size,
                                d_model=dims.d_model)
    try:
        HEAD.build(config["head"], embedding=embedding, d_model=dims.d_model)
    except ConfigError as refusal:
        return [str(refusal)]
    return []


def compile_latex(folder: Path, inputs: list[str]) -> subprocess.CompletedProcess:
    """pdflatex on a document that \\inputs ``inputs`` (.tex files in ``folder``), booktabs loaded."""
    body = "\n".join(rf"\input{{{name}}}" for name in inputs)
    (folder / "doc.tex").write_text(
        "\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
        f"{body}\n\\end{{document}}\n")
    return subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
                          cwd=folder, capture_output=True, text=True, timeout=60)


SMALL_DIMS = ("model.d_model=32", "model.n_heads=2", "model.n_layers=2", "model.d_ff=64",
              "data.seq_len=16")
"""A model small enough for unit tests of a whole stack."""

OPTION_DIMS = ("data.seq_len=16", "model.d_model=32", "model.n_heads=2", "model.n_layers=2",
               "model.d_ff=64", "model.pool=mean")
"""The sizes of the registry-wide sweeps (one option a case): ``compose_config(f"{group}=
{name}", *OPTION_DIMS)`` is composed once for all the files that use it."""


def seeded_model(*overrides: str, seed: int = 0, vocab_size: int = 64):
    """The model ``overrides`` describe, its weights drawn from ``seed``."""
    from xformer_bench.models.build import build_model

    torch.manual_seed(seed)
    return build_model(compose_config(*overrides), vocab_size=vocab_size)


def seeded_tokens(seed: int = 0, batch: int = 3, length: int = 16, vocab_size: int = 64):
    """(batch, length) random token ids from their own generator (the global RNG untouched)."""
    return torch.randint(0, vocab_size, (batch, length),
                         generator=torch.Generator().manual_seed(seed))


def changed_future(model, tokens, from_position: int, other_tokens, state=lambda model: None):
    """Run ``model`` on ``tokens`` and on a copy whose positions from ``from_position`` on come
    from ``other_tokens``; assert the earlier outputs equal and the later ones differ (a causal
    model that reads its input).  Returns ``state(model)`` after each run, for extra checks."""
    changed = tokens.clone()
    changed[:, from_position:] = other_tokens[:, from_position:]
    outputs = []
    with torch.no_grad():
        for batch in (tokens, changed):
            getattr(model, "reset_memory", lambda: None)()  # both runs start without memory
            outputs.append((model(batch), state(model)))
    (out_a, state_a), (out_b, state_b) = outputs
    k = from_position
    torch.testing.assert_close(out_a[:, :k], out_b[:, :k], atol=1e-5, rtol=0)
    assert not torch.allclose(out_a[:, k:], out_b[:, k:])
    return state_a, state_b


def two_training_steps(model, length: int = 16) -> list[float]:
    """The byte-LM loss (plus any auxiliary loss's gradient) of two AdamW steps on fixed random
    bytes: a model that builds must train, finitely, and change."""
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 256, (2, length + 1), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(2):
        log_p = model(tokens[:, :-1])  # (B, T, V)
        loss = F.nll_loss(log_p.flatten(0, 1), tokens[:, 1:].flatten())
        auxiliary = model.auxiliary_loss()
        (loss if auxiliary is None else loss + auxiliary).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
