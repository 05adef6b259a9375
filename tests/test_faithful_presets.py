"""Presets as their papers ran them: the Sparse Transformer's pattern follows the
data, FNet is the paper's post-LN encoder, the base Transformer trains with Vaswani et al.'s
optimiser, and a preset's optimiser is checked like any other."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import compose_config, xbench
from xformer_bench.models.build import build_classifier
from xformer_bench.resolvers import vaswani_lr
from xformer_bench.tasks.schedule import lr_factor


@pytest.mark.parametrize(("data", "pattern"), [
    ("text", "fixed"), ("enwik8", "fixed"), ("synthetic", "fixed"), ("listops", "fixed"),
    ("cifar10", "strided"), ("cifar10_classify", "strided"), ("imagenet", "strided")])
def test_the_sparse_transformer_uses_the_papers_pattern_for_the_data(data, pattern):
    """Child et al. 2019, Table 2: fixed (l=128, c=32) on enwik8, strided on CIFAR-10."""
    attention = compose_config("model=sparse_transformer", f"data={data}")["attention"]
    assert attention["name"] == pattern and attention["stride"] == 128
    if pattern == "fixed":
        assert attention["summary"] == 32 and attention["mode"] == "merged"


def test_the_command_line_still_wins_over_the_datas_pattern():
    assert compose_config("model=sparse_transformer", "data=cifar10",
                          "attention=fixed")["attention"]["name"] == "fixed"
    assert compose_config("model=sparse_transformer", "data=text",
                          "attention=local")["attention"]["name"] == "local"
    assert compose_config("model=vanilla", "data=cifar10")["attention"]["name"] == "full"


def _stream_growth(*overrides: str, length: int = 512, width: int = 128) -> list[float]:
    """The std of the residual stream after each block of an FNet encoder fed unit-std inputs,
    over the std before the block."""
    config = compose_config("model=fnet", "data=listops", f"data.seq_len={length}",
                            f"model.d_model={width}", "model.n_layers=2", *overrides)
    datamodule = SimpleNamespace(input_kind="tokens", vocab_size=16, pad_id=0, num_classes=10)
    model = build_classifier(config, datamodule).eval()
    ratios = []

    def record(module, inputs, output):
        ratios.append(float(output.std() / inputs[0].std()))

    for block in model.stack.blocks:
        block.register_forward_hook(record)
    with torch.no_grad():
        model.stack(torch.randn(2, length, width), model_context(model))
    return ratios


def model_context(model):
    from xformer_bench.core.context import ForwardContext

    return ForwardContext(model.position, causal=False)


def test_fnet_is_the_papers_post_ln_encoder_and_its_stream_stays_unit_scale():
    config = compose_config("model=fnet", "data=listops")
    assert config["model"]["norm_placement"] == "post"
    assert config["attention"]["fft_norm"] == "backward"  # the paper's unnormalised DFT
    assert config["position"]["name"] == "learned"
    assert max(_stream_growth()) < 2.0
    # the guard catches the old preset: pre-LN adds the ~sqrt(T D) = 256x transform unscaled
    assert max(_stream_growth("model.norm_placement=pre")) > 50


def test_transformer_base_trains_with_vaswanis_optimiser():
    optim = compose_config("model=transformer_base", "data=wmt14")["optim"]
    assert optim["betas"] == [0.9, 0.98] and optim["eps"] == 1e-9
    assert optim["weight_decay"] == 0.0 and optim["warmup_steps"] == 4000
    assert optim["decay"] == "inverse_sqrt"
    assert optim["lr"] == pytest.approx(128 ** -0.5 * 4000 ** -0.5)
    wider = compose_config("model=transformer_base", "model.d_model=512")["optim"]
    assert wider["lr"] == pytest.approx(6.99e-4, rel=1e-3)  # the paper's base: 512^-0.5 4000^-0.5


@pytest.mark.parametrize("step", [1, 2, 100, 3999, 4000, 4001, 10_000, 99_999])
def test_the_house_schedule_is_vaswanis_eq_3_step_for_step(step):
    """lrate = d^-0.5 min(s^-0.5, s w^-1.5), s counted from 1 (the scheduler's step s-1)."""
    d, w = 512, 4000
    paper = d ** -0.5 * min(step ** -0.5, step * w ** -1.5)
    house = vaswani_lr(d, w) * lr_factor(step - 1, warmup_steps=w, total_steps=100_000,
                                         decay="inverse_sqrt", min_lr_ratio=0.1)
    assert house == pytest.approx(paper, rel=1e-12)


@pytest.mark.parametrize(("override", "says"), [
    ("optim.lr=0", "error: optim.lr=0 must be a positive number"),
    ("optim.warmup_steps=-1", "error: optim.warmup_steps=-1 must be 0 or a positive integer"),
])
def test_a_presets_optimiser_refuses_bad_values_in_one_line(override, says, tmp_path):
    done = xbench("model=transformer_base", override, "trainer.max_steps=1", "logger=none",
                  f"paths.results_dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() + done.stdout.splitlines()
              if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(says), done.stderr[-500:]
