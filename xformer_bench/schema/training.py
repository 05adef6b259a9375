"""The ``trainer`` and ``logger`` groups: how a run trains and where its metrics go."""

from __future__ import annotations

from xformer_bench.hardware import ACCELERATORS, LEGACY_PRECISIONS, PRECISIONS
from xformer_bench.schema.group import Group
from xformer_bench.schema.keys import Bool, Choice, Either, Float, Int, Seq, Text

WANDB_MODES = ("auto", "online", "offline", "disabled")

TRAINER = Group("trainer", common={
    "accelerator": Choice("the Lightning accelerator", ACCELERATORS),
    "devices": Either("processes (devices) per node", (
        Int("", 1), Choice("", (-1, "auto")), Seq("", item=Int("", 0)))),
    "num_nodes": Int("machines", 1),
    "strategy": Text("the Lightning strategy: auto, ddp, fsdp, ..."),
    "precision": Choice("the numeric precision; auto: bf16-mixed on a bf16 GPU, else 32-true",
                        ("auto", *PRECISIONS, *LEGACY_PRECISIONS)),
    "compile": Either("torch.compile the model: true (inductor) or a backend name",
                      (Bool(""), Text(""))),
    "max_steps": Int("optimiser steps to train", 1),
    "accumulate_grad_batches": Int("batches whose gradients make one optimiser step", 1),
    "gradient_clip_val": Float("the gradient-norm clip; 0 disables clipping", 0),
    "val_checks": Int("evenly spaced validations; the first is the early metric", 1),
    "limit_val_batches": Either("the validation split evaluated: a fraction of it, or a number "
                                "of batches", (Float("", 0, 1, open_lo=True), Int("", 1))),
    "log_every_n_steps": Int("steps between logged training metrics", 1, computes=False),
    "checkpoint": Bool("a checkpoint at every validation, and last.ckpt", computes=False),
    "checkpoint_every": Int("resume=auto: a resume point every N steps too", 1,
                            null="only before each validation", computes=False),
    "keep_weights": Choice("keep the final weights for xbench-sample (<checkpoint_dir>/"
                           "<experiment>/<run_id>/final.pt); auto: language models of at most "
                           "50M parameters", ("auto", True, False), computes=False),
    "progress_bar": Choice("show the progress bar; auto: when stderr is a terminal (else one "
                           "line per validation)", ("auto", True, False), computes=False),
    "deterministic": Either("deterministic algorithms only", (Bool(""), Choice("", ("warn",)))),
})

LOGGER = Group("logger", computes=False, common={
    "name": Text("where metrics go: csv, none, wandb")}, options={
    "csv": {},
    "none": {},
    "wandb": {
        "project": Text("the W&B project"),
        "entity": Text("the W&B user or team", null="the API key's default entity"),
        "tags": Seq("W&B tags", item=Text(""), empty=True),
        "mode": Choice("auto: WANDB_MODE, else online with an API key, else offline",
                       WANDB_MODES),
    },
})
