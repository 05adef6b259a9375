"""``experiment=lra`` and ``experiment=lra_image``: the Long Range Arena's released ListOps and
Image configurations, each attention row at LRA's module defaults
(``conf/study_rows/<study>/<attention>.yaml``, picked by the study and the row's attention).
Every row composes with its study into LRA's setting and builds as a bidirectional encoder
classifier; the schedule is LRA's ``0.05 * linear_warmup * rsqrt_decay``; outside the study an
option keeps its own defaults."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from conftest import compose_config
from xformer_bench.config import CONF_DIR
from xformer_bench.models.build import build_classifier
from xformer_bench.tasks.schedule import lr_factor

# row: (attention option, its keys as LRA's module sets them, LRA's row name)
LISTOPS_ROWS = {
    "lra_transformer": ("full", {"dropout": 0.1}, "Transformer"),
    "lra_local": ("block_local", {"block": 50, "memory": 0}, "Local Attention"),
    "lra_sparse_transformer": ("fixed", {"stride": 50, "summary": 10, "mode": "merged"},
                               "Sparse Trans."),
    "lra_longformer": ("longformer", {"window": 512, "n_global": 0, "dilation": 1}, "Longformer"),
    "lra_linformer": ("linformer", {"k": 16, "sharing": "key_value"}, "Linformer"),
    "lra_reformer": ("lsh", {"chunk_size": 201, "n_hashes": 1, "n_buckets": 10}, "Reformer"),
    "lra_sinkhorn": ("sinkhorn", {"block": 50, "sinkhorn_iters": 0, "temperature": 1.0},
                     "Sinkhorn Trans."),
    "lra_synthesizer": ("synthesizer", {"mode": "random", "mix_with_dot_product": True},
                        "Synthesizer"),
    "lra_bigbird": ("bigbird", {"block": 64, "window_blocks": 3, "global_blocks": 2,
                                "random_blocks": 3}, "BigBird"),
    "lra_linear_transformer": ("linear", {"eps": 1e-6}, "Linear Trans."),
    "lra_performer": ("performer", {"kernel": "softmax", "n_features": 2, "redraw_interval": 1},
                      "Performer"),
}
ADDED = {"lra_nystromformer": "nystromformer", "lra_xcit": "xcit"}  # xbench's, not LRA's

# row: (attention option, its keys, (n_layers, d_model, n_heads, d_ff), pool, dropout,
# weight decay) -- lra_benchmarks/image/configs/cifar10/<model>_base.py
BASE = (1, 128, 8, 128)
IMAGE_ROWS = {
    "lra_image_transformer": ("full", {"dropout": 0.2}, BASE, "cls", 0.3, 0.0),
    "lra_image_local": ("block_local", {"block": 64, "memory": 0}, (1, 128, 2, 128), "mean",
                        0.3, 0.0),
    "lra_image_sparse_transformer": ("fixed", {"stride": 50, "summary": 10, "mode": "merged"},
                                     BASE, "cls", 0.3, 0.0),
    "lra_image_longformer": ("longformer", {"window": 512, "n_global": 0}, (4, 128, 4, 128),
                             "mean", 0.3, 0.0),
    "lra_image_linformer": ("linformer", {"k": 16, "sharing": "key_value"}, BASE, "cls", 0.3,
                            0.0),
    "lra_image_reformer": ("lsh", {"chunk_size": 103, "n_hashes": 1, "n_buckets": 10},
                           (4, 64, 8, 64), "cls", 0.3, 0.0),
    "lra_image_sinkhorn": ("sinkhorn", {"block": 64, "sinkhorn_iters": 0, "temperature": 1.0},
                           (1, 32, 1, 64), "mean", 0.1, 0.7),
    "lra_image_synthesizer": ("synthesizer", {"mode": "random", "mix_with_dot_product": True},
                              BASE, "cls", 0.3, 0.0),
    "lra_image_bigbird": ("bigbird", {"block": 64}, (1, 128, 4, 128), "cls", 0.3, 0.0),
    "lra_image_linear_transformer": ("linear", {}, BASE, "cls", 0.3, 0.0),
    "lra_image_performer": ("performer", {"kernel": "relu", "redraw_interval": 10 ** 9}, BASE,
                            "cls", 0.3, 0.0),
    "lra_image_nystromformer": ("nystromformer", {}, BASE, "cls", 0.3, 0.0),
    "lra_image_xcit": ("xcit", {}, BASE, "cls", 0.3, 0.0),
}
LISTOPS = {**{m: r[0] for m, r in LISTOPS_ROWS.items()}, **ADDED}  # row -> attention
IMAGE = {m: r[0] for m, r in IMAGE_ROWS.items()}


def study(name: str):
    return OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml")


def yaml_of(group: str, option: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"))


@pytest.mark.parametrize("name,rows,data", [("lra", LISTOPS, "listops"),
                                            ("lra_image", IMAGE, "cifar10_classify")])
def test_a_study_sweeps_its_rows_as_attention_options_with_their_settings(name, rows, data):
    declared = study(name)
    assert declared.sweep.attention.split(",") == list(rows.values())  # LRA's, then additions
    assert declared.sweep.data == data and declared.sweep.seed == "0,1,2"
    assert declared.baseline == {"attention": "full"}
    settings = sorted(p.stem for p in (CONF_DIR / "study_rows" / name).glob("*.yaml"))
    assert settings == sorted(rows.values())  # one settings file per row, none unused


def test_the_listops_study_is_lra_listops_configuration():
    """base_listops_config.py (f866e43), listops/train.py, TransformerEncoder's defaults."""
    config = compose_config("experiment=lra", "attention=full")
    model, data, optim = config["model"], config["data"], config["optim"]
    assert (model["d_model"], model["n_layers"], model["n_heads"], model["d_ff"]) == \
        (512, 6, 8, 2048)
    assert model["dropout"] == 0.1 and model["pool"] == "cls"
    assert model["norm_placement"] == "pre" and not model["share_blocks"]
    assert (config["position"]["name"], config["norm"]["name"], config["activation"]["name"]) \
        == ("sinusoidal", "layernorm", "gelu")
    assert data["name"] == "listops"
    assert (data["min_length"], data["max_length"], data["seq_len"]) == (500, 2000, 2000)
    assert (data["n_train"], data["n_val"], data["n_test"]) == (96000, 2000, 2000)
    assert (data["max_depth"], data["max_args"], data["batch_size"]) == (10, 10, 32)
    assert config["trainer"]["max_steps"] == 5000 and config["trainer"]["gradient_clip_val"] == 0
    assert optim["lr"] == pytest.approx(0.05 / math.sqrt(1000), rel=1e-12)
    assert (optim["warmup_steps"], optim["decay"]) == (1000, "inverse_sqrt")
    assert list(optim["betas"]) == [0.9, 0.98] and optim["eps"] == 1e-9
    assert optim["weight_decay"] == 0.1


def test_the_schedule_is_lra_rsqrt_decay_one_step_on():
    """LRA: lr(s) = 0.05 min(1, s / 1000) / sqrt(max(s, 1000)) at its step s (0 at s = 0);
    xbench's optimiser step s takes LRA's rate of step s + 1."""
    optim = compose_config("experiment=lra")["optim"]
    for step in (0, 1, 499, 998, 999, 1000, 1500, 2999, 4999):
        ours = optim["lr"] * lr_factor(step, warmup_steps=optim["warmup_steps"],
                                       total_steps=5000, decay=optim["decay"],
                                       min_lr_ratio=optim["min_lr_ratio"])
        s = step + 1
        assert ours == pytest.approx(0.05 * min(1, s / 1000) / math.sqrt(max(s, 1000)),
                                     rel=1e-9)


@pytest.mark.parametrize("row", LISTOPS_ROWS)
def test_a_listops_row_composes_at_lra_module_defaults(row):
    option, keys, label = LISTOPS_ROWS[row]
    config = compose_config("experiment=lra", f"attention={option}")
    assert config["attention"]["name"] == option
    assert {k: config["attention"][k] for k in keys} == keys
    assert config["attention"]["label"] == label
    assert config["model"]["pool"] == ("mean" if row == "lra_sinkhorn" else "cls")
    assert (config["model"]["d_model"], config["model"]["n_layers"]) == (512, 6)  # the study's


@pytest.mark.parametrize("row", ADDED)
def test_the_additions_are_marked_and_run_at_xbench_defaults(row):
    config = compose_config("experiment=lra", f"attention={ADDED[row]}")
    own = yaml_of("attention", ADDED[row])
    assert {k: v for k, v in config["attention"].items() if k != "label"} == \
        {k: v for k, v in own.items() if k != "label"}
    assert config["attention"]["label"].endswith("(added)")


def test_the_image_study_is_lra_cifar10_configuration():
    """base_cifar10_config.py (f866e43) and transformer_base.py (ee6649e)."""
    config = compose_config("experiment=lra_image", "attention=full")
    data, optim, trainer = config["data"], config["optim"], config["trainer"]
    assert (data["name"], data["channels"], data["seq_len"]) == ("cifar10_classify", "gray", 1024)
    assert (data["val_size"], data["batch_size"]) == (5000, 256)
    assert (trainer["max_steps"], trainer["gradient_clip_val"]) == (35000, 0)
    assert (optim["lr"], optim["warmup_steps"], optim["decay"], optim["min_lr_ratio"]) == \
        (5e-4, 175, "cosine", 0.0)
    assert list(optim["betas"]) == [0.9, 0.98] and optim["eps"] == 1e-9
    assert config["position"]["name"] == "learned"


@pytest.mark.parametrize("row", IMAGE_ROWS)
def test_an_image_row_sets_its_lra_model_lines(row):
    option, keys, sizes, pool, dropout, weight_decay = IMAGE_ROWS[row]
    config = compose_config("experiment=lra_image", f"attention={option}")
    model = config["model"]
    assert config["attention"]["name"] == option
    assert {k: config["attention"][k] for k in keys} == keys
    assert (model["n_layers"], model["d_model"], model["n_heads"], model["d_ff"]) == sizes
    assert (model["pool"], model["dropout"]) == (pool, dropout)
    assert config["optim"]["weight_decay"] == weight_decay
    listops_row = row.replace("lra_image_", "lra_")
    label = config["attention"]["label"]
    assert label == LISTOPS_ROWS[listops_row][2] if listops_row in LISTOPS_ROWS \
        else label.endswith("(added)")


TINY = ("model.d_model=32", "model.n_heads=2", "model.n_layers=2", "model.d_ff=64",
        "model.pool=cls")


def _tiny(study_name: str, row: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The row's classifier at d_model 32 over 64 tokens (ListOps: 12 symbols, padded)."""
    if study_name == "lra":
        config = compose_config("experiment=lra", f"attention={LISTOPS[row]}", *TINY,
                                "data.max_length=64", "data.min_length=8")
        inputs = SimpleNamespace(input_kind="tokens", num_classes=10, vocab_size=12, pad_id=0)
        tokens = torch.randint(1, 12, (2, 64), generator=torch.Generator().manual_seed(0))
        tokens[1, -20:] = 0
    else:
        config = compose_config("experiment=lra_image", f"attention={IMAGE[row]}", *TINY,
                                "data.seq_len=64")
        inputs = SimpleNamespace(input_kind="tokens", num_classes=10, vocab_size=256, pad_id=None)
        tokens = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    return build_classifier(config, inputs), tokens


@pytest.mark.parametrize("study_name,row", [("lra", r) for r in LISTOPS]
                         + [("lra_image", r) for r in IMAGE], ids=lambda v: v)
def test_a_row_builds_as_a_bidirectional_encoder(study_name, row):
    """Built as the classifier (which refuses attention without a bidirectional form), it
    trains a step, and its [CLS] state reads a later token."""
    model, tokens = _tiny(study_name, row)
    logits = model(tokens)
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()
    torch.nn.functional.cross_entropy(logits, torch.tensor([1, 2])).backward()
    model.eval()
    model.head = torch.nn.Identity()  # the pooled [CLS] state, (B, D)
    changed = tokens.clone()
    changed[:, 1] = torch.where(tokens[:, 1] == 5, 6, 5)  # the token after the first
    with torch.no_grad():
        assert not torch.allclose(model(tokens), model(changed))


@pytest.mark.parametrize("option", ["block_local", "fixed", "sinkhorn", "full"])
def test_outside_the_study_an_option_keeps_its_own_defaults(option):
    """The row settings are the study's: a plain run of the same option is untouched."""
    config = compose_config(f"attention={option}")
    assert config["attention"] == yaml_of("attention", option)
    assert config["model"]["d_model"] == 128 and config["model"]["pool"] == "cls"


def test_the_command_line_still_wins_over_a_row_setting():
    config = compose_config("experiment=lra", "attention=block_local", "attention.block=7",
                            "model.pool=cls")
    assert config["attention"]["block"] == 7 and config["attention"]["memory"] == 0
