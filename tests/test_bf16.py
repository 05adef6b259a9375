"""bf16 on every option: forward + backward under CPU bf16 autocast (as ``bf16-mixed`` training
runs on a GPU) against float32, for every option of the attention, stack, position, norm and ffn
registries.  Outputs and gradients must be finite and within the option's declared relative
error (:data:`references.BF16_TOLERANCE`, the reasons beside the loose ones)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import SMALL_DIMS, seeded_model, seeded_tokens
from references import BF16_TOLERANCE, bf16_tolerance
from test_attention_zoo import OPTIONS as ATTENTION_OPTIONS
from test_attention_zoo import contexts, mixer
from xformer_bench.config import CONF_DIR


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


MODEL_CASES = [(group, name) for group in ("stack", "position", "norm", "ffn")
               for name in _options(group)]


def relative_error(value: torch.Tensor, reference: torch.Tensor, floor: float = 1e-12) -> float:
    """``|value - reference| / max(|reference|, floor)``: the floor keeps a gradient that is
    zero in exact arithmetic (a key bias under softmax) from dividing rounding by ~0."""
    return float((value.float() - reference).norm() / max(float(reference.norm()), floor))


def under_both_precisions(run, module: torch.nn.Module):
    """``run(copy, bf16)`` -> (output, gradients) in float32 and under bf16 autocast, each on its
    own copy of ``module`` (running statistics and memories start alike)."""
    return run(copy.deepcopy(module), False), run(copy.deepcopy(module), True)


def assert_close_in_bf16(key: str, fp32, bf16) -> None:
    (out32, grads32), (out16, grads16) = fp32, bf16
    assert torch.isfinite(out16).all(), f"{key}: non-finite output under bf16"
    assert all(torch.isfinite(g).all() for g in grads16), f"{key}: non-finite gradient"
    out_tol, grad_tol = bf16_tolerance(key)
    assert relative_error(out16, out32) < out_tol, f"{key}: output {relative_error(out16, out32)}"
    floor = 1e-3 * max(float(g.norm()) for g in grads32)
    worst = max(relative_error(a, b, floor) for a, b in zip(grads16, grads32))
    assert worst < grad_tol, f"{key}: gradient relative error {worst:.3g} > {grad_tol}"


@pytest.mark.parametrize("name", ATTENTION_OPTIONS)
def test_every_attention_option_trains_in_bf16_as_in_float32(name):
    layer = mixer(name, seq_len=32)
    x = torch.randn(2, 32, 32, generator=torch.Generator().manual_seed(0))
    for ctx in contexts(layer):
        def run(layer, bf16: bool):
            inputs = x.clone().requires_grad_(True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = layer.train()(inputs, ctx)
            out.float().square().mean().backward()
            grads = [inputs.grad] + [p.grad for p in layer.parameters() if p.grad is not None]
            return out.detach().float(), grads

        assert_close_in_bf16(f"attention={name}", *under_both_precisions(run, layer))


@pytest.mark.parametrize(("group", "name"), MODEL_CASES, ids=[f"{g}={n}" for g, n in MODEL_CASES])
def test_every_model_option_trains_in_bf16_as_in_float32(group, name):
    model = seeded_model(*SMALL_DIMS, f"{group}={name}")
    tokens = seeded_tokens(length=17)

    def run(model, bf16: bool):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model.train()(tokens[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        return logits.detach().float(), [p.grad for p in model.parameters() if p.grad is not None]

    assert_close_in_bf16(f"{group}={name}", *under_both_precisions(run, model))


def test_the_check_fails_on_a_planted_float16_overflow():
    """A prefix sum accumulated in float16 overflows (the failure class the test is for)."""
    x = torch.full((1, 4096), 30.0)
    planted = (x.half().cumsum(-1).float(), [x])
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close_in_bf16("planted", (x.cumsum(-1), [x]), planted)


def test_every_declared_tolerance_names_an_option_and_a_reason():
    known = {f"attention={n}" for n in ATTENTION_OPTIONS} | {f"{g}={n}" for g, n in MODEL_CASES}
    for key, (out_tol, grad_tol, reason) in BF16_TOLERANCE.items():
        assert key in known, key
        assert len(reason) > 20 and 0 < out_tol <= 0.5 and 0 < grad_tol <= 0.7
