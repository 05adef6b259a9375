"""The delta-rule mixers ``deltanet`` and ``gated_deltanet``: the chunked WY engine
(:mod:`xformer_bench.attention._ops.delta_rule`) against the plain recurrence, written here in the
papers' (Dv, Dk) notation; causality across chunk boundaries, key padding, the papers' defaults
as built, recurrent decoding against the forward pass, and (on a GPU with fla) fla's kernels."""

from __future__ import annotations

import math

import pytest
import torch

from xformer_bench.attention._ops.delta_rule import delta_rule, delta_rule_step, fla_available
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.decode_cache import DecodeCache
from xformer_bench.core.dims import ModelDims
from xformer_bench.errors import ConfigError
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.position import Position

NAMES = ("deltanet", "gated_deltanet")


def recurrence(q, k, v, beta, log_alpha=None, state=None, scale=1.0):
    """S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = scale S_t q_t, one
    position at a time; q, k (B, H, T, Dk), v (B, H, T, Dv), beta and log_alpha (B, H, T),
    ``state`` (B, H, Dk, Dv) as the engine keeps it (S^T).  Returns o and the final S^T."""
    b, h, t, dk = k.shape
    s = (q.new_zeros(b, h, v.shape[-1], dk) if state is None
         else state.transpose(-1, -2))  # (B, H, Dv, Dk): the papers' S
    eye = torch.eye(dk, dtype=q.dtype)
    out = []
    for i in range(t):
        kt, bt = k[:, :, i], beta[:, :, i, None, None]
        alpha = 1.0 if log_alpha is None else log_alpha[:, :, i, None, None].exp()
        s = alpha * s @ (eye - bt * kt[..., :, None] * kt[..., None, :]) \
            + bt * v[:, :, i, :, None] * kt[..., None, :]
        out.append(scale * (s @ q[:, :, i, :, None]).squeeze(-1))
    return torch.stack(out, dim=2), s.transpose(-1, -2)


def inputs(t=29, dk=6, dv=5, gated=True, seed=0, harsh=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, t, dk, generator=g, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(2, 3, t, dk, generator=g, dtype=torch.float64),
                                      dim=-1)
    v = torch.randn(2, 3, t, dv, generator=g, dtype=torch.float64)
    beta = torch.rand(2, 3, t, generator=g, dtype=torch.float64)
    log_alpha = None
    if gated:
        log_alpha = -torch.nn.functional.softplus(2 * torch.randn(2, 3, t, generator=g,
                                                                  dtype=torch.float64))
        if harsh:  # near-total forgetting: gamma within a chunk underflows, its ratios must not
            log_alpha[:, :, ::3] = -400.0
    state = torch.randn(2, 3, dk, dv, generator=g, dtype=torch.float64)
    return [x.float().requires_grad_() if x is not None else None
            for x in (q, k, v, beta, log_alpha, state)]


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("chunk", [1, 4, 7, 16, 64])  # 7, 16: not divisors of 29; 64 > T: one chunk
def test_chunked_equals_the_recurrence_forward_and_gradients(gated, chunk):
    args = inputs(gated=gated)
    out, state = delta_rule(*args[:5], scale=0.4, chunk_size=chunk, initial_state=args[5])
    ref_out, ref_state = recurrence(*args, scale=0.4)
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(state, ref_state, atol=2e-5, rtol=2e-5)
    probe = [torch.randn_like(out), torch.randn_like(state)]
    leaves = [a for a in args if a is not None]
    grads = torch.autograd.grad((out * probe[0]).sum() + (state * probe[1]).sum(), leaves)
    ref = torch.autograd.grad((ref_out * probe[0]).sum() + (ref_state * probe[1]).sum(), leaves)
    for got, want in zip(grads, ref):
        torch.testing.assert_close(got, want, atol=5e-5, rtol=5e-5)


def test_gated_chunks_stay_finite_where_the_cumulative_decay_underflows():
    args = inputs(gated=True, harsh=True)
    out, state = delta_rule(*args[:5], scale=1.0, chunk_size=16, initial_state=args[5])
    ref_out, ref_state = recurrence(*(a.detach().double() for a in args))  # float64
    # gaps summed as such: g_i - g_j as a difference of running sums near -1e3 was off by 1e-4
    torch.testing.assert_close(out, ref_out.float(), atol=5e-6, rtol=5e-6)
    torch.testing.assert_close(state, ref_state.float(), atol=5e-6, rtol=5e-6)
    out.sum().backward()
    assert all(torch.isfinite(a.grad).all() for a in args)


@pytest.mark.parametrize("gated", [False, True])
def test_one_step_and_chunks_from_a_carried_state_continue_the_sequence(gated):
    q, k, v, beta, log_alpha, state = (a.detach() if a is not None else None
                                       for a in inputs(t=12, gated=gated))
    ref_out, ref_state = recurrence(q, k, v, beta, log_alpha, state)
    first, s = delta_rule(q[:, :, :7], k[:, :, :7], v[:, :, :7], beta[..., :7],
                          None if log_alpha is None else log_alpha[..., :7], scale=1.0,
                          chunk_size=3, initial_state=state)
    steps = [first]
    for i in range(7, 12):
        o, s = delta_rule_step(q[:, :, i], k[:, :, i], v[:, :, i], beta[..., i],
                               None if log_alpha is None else log_alpha[..., i], scale=1.0,
                               state=s)
        steps.append(o.unsqueeze(2))
    torch.testing.assert_close(torch.cat(steps, 2), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, ref_state, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------- the mixers

def build(name: str, d_model: int = 32, n_heads: int = 2, **overrides):
    from omegaconf import OmegaConf

    from xformer_bench.config import CONF_DIR

    spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "attention" / f"{name}.yaml"))
    dims = ModelDims(d_model=d_model, n_heads=n_heads, n_layers=2, d_ff=64, seq_len=64,
                     vocab_size=256)
    torch.manual_seed(0)
    return build_token_mixer({**spec, **overrides}, dims).eval()


@pytest.mark.parametrize("name", NAMES)
def test_the_mixer_does_not_depend_on_its_chunk_size(name):
    layer = build(name)
    x = torch.randn(2, 23, 32)
    ctx = ForwardContext(Position())
    with torch.no_grad():
        reference = layer(x, ctx)
        for chunk in (1, 5, 8):
            layer.chunk_size = chunk
            torch.testing.assert_close(layer(x, ctx), reference, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("name", NAMES)
def test_changing_a_token_never_changes_earlier_outputs_across_chunks(name):
    layer = build(name, chunk_size=4)
    x = torch.randn(2, 20, 32)
    ctx = ForwardContext(Position())
    with torch.no_grad():
        before = layer(x, ctx)
        for first in (1, 4, 5, 11, 19):
            changed = x.clone()
            changed[:, first:] += torch.randn(2, 20 - first, 32)
            after = layer(changed, ctx)
            torch.testing.assert_close(after[:, :first], before[:, :first], atol=0, rtol=0)
            assert not torch.allclose(after[:, first:], before[:, first:])


@pytest.mark.parametrize("name", NAMES)
def test_padded_positions_change_no_other_output(name):
    layer = build(name, chunk_size=4)
    pad = torch.zeros(2, 18, dtype=torch.bool)
    pad[0, 5:9] = pad[1, -3:] = True
    x = torch.randn(2, 18, 32)
    changed = torch.where(pad[..., None], torch.randn(2, 18, 32), x)
    ctx = ForwardContext(Position(), key_padding_mask=pad)
    with torch.no_grad():
        outs = [layer(inp, ctx) for inp in (x, changed)]
    torch.testing.assert_close(outs[0][~pad], outs[1][~pad], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("prefix", [1, 6])
def test_recurrent_decoding_equals_the_forward_pass(name, prefix):
    layer = build(name, chunk_size=4)
    x = torch.randn(2, 13, 32)
    cache = DecodeCache()
    with torch.no_grad():
        full = layer(x, ForwardContext(Position()))
        steps = []
        for lo, hi in [(0, prefix), *((i, i + 1) for i in range(prefix, 13))]:
            cache.begin_step(hi - lo)
            steps.append(layer(x[:, lo:hi], ForwardContext(Position(), cache=cache)))
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    memory, past = cache.slots[0]["state"]
    assert memory.shape == (2, 2, layer.dk, layer.dv) and past.shape[1] == 3  # conv_size - 1


def test_the_papers_defaults_as_built():
    d = 64
    delta = build("deltanet", d_model=d, n_heads=2)
    assert (delta.dk, delta.dv, delta.conv.shape[-1]) == (32, 32, 4)
    assert delta.gate is None and delta.beta.bias is None and delta.norm.eps == 1e-6
    assert delta.chunk_size == 64 and delta.decode_state == "recurrent"
    gated = build("gated_deltanet", d_model=d, n_heads=2)
    assert (gated.dk, gated.dv, gated.conv.shape[-1]) == (24, 48, 4)  # 0.75 d, 1.5 d over 2 heads
    assert gated.gate is not None and gated.beta.bias is not None and gated.decay.bias is None
    # ~6 d^2 in projections with the gate (the paper's budget, like Mamba-2's)
    projections = sum(m.weight.numel() for m in (gated.qkv, gated.gate, gated.out))
    assert projections == 6 * d * d
    a = gated.A_log.exp()
    assert ((a > 0) & (a < 16)).all()
    dt = torch.nn.functional.softplus(gated.dt_bias)
    assert ((dt > 1e-4 - 1e-7) & (dt < 0.1 + 1e-6)).all()
    for layer in (delta, gated):
        assert layer.provides == {"causal", "key_padding_mask", "variable_length"}
        assert layer.sub_quadratic


@pytest.mark.parametrize("overrides", [{"expand_k": 0.3}, {"expand_v": 0.0}, {"conv_size": 0},
                                       {"chunk_size": 0}])
def test_a_width_that_does_not_split_over_the_heads_is_one_line(overrides):
    with pytest.raises(ConfigError, match="attention."):
        build("gated_deltanet", **overrides)


# --------------------------------------------------------------------------- GPU: fla's kernels

@pytest.mark.skipif(not torch.cuda.is_available() or not fla_available(),
                    reason="needs a CUDA GPU and flash-linear-attention (pip install -e '.[fla]')")
@pytest.mark.parametrize("gated", [False, True])
def test_fla_kernels_equal_the_chunked_engine_within_bf16(gated):
    args = [a.detach().cuda() if a is not None else None for a in inputs(t=200, dk=64, dv=64,
                                                                        gated=gated)]
    from xformer_bench.attention._ops.fla_kernels import _gated_backward_refused_here

    q, k, v, beta, log_alpha, state = args
    backward = not (gated and _gated_backward_refused_here())  # fla issue #640: forward only
    results = {}
    for backend in ("torch", "fla"):
        leaves = [x.bfloat16().requires_grad_(backward) for x in (q, k, v)]  # as under autocast
        leaves += [x.clone().requires_grad_(backward) for x in (beta, log_alpha)
                   if x is not None]
        with torch.set_grad_enabled(backward):
            out, final = delta_rule(*leaves[:4], leaves[4] if gated else None,
                                    scale=64 ** -0.5, chunk_size=64, initial_state=state,
                                    backend=backend)
        if backward:
            out.float().square().sum().backward()
        results[backend] = [out.float(), final] + [x.grad.float() for x in leaves if backward]
    for got, want in zip(results["fla"], results["torch"]):
        error = (got - want).norm() / want.norm().clamp_min(1e-6)
        assert error < 0.03, error


@pytest.mark.skipif(not torch.cuda.is_available() or not fla_available(),
                    reason="needs a CUDA GPU and flash-linear-attention (pip install -e '.[fla]')")
@pytest.mark.parametrize("name", NAMES)
def test_the_mixer_on_a_gpu_uses_fla_and_agrees_with_the_cpu_path(name, monkeypatch):
    from xformer_bench.attention._ops import delta_rule as engine

    calls, real = [], engine._fla
    monkeypatch.setattr(engine, "_fla", lambda *a: calls.append(1) or real(*a))
    layer = build(name, d_model=128, n_heads=2)
    x = torch.randn(2, 150, 128)
    with torch.no_grad():
        cpu = layer(x, ForwardContext(Position()))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            gpu = layer.cuda()(x.cuda(), ForwardContext(Position())).float().cpu()
    assert calls and math.isfinite((gpu - cpu).norm().item())
    assert (gpu - cpu).norm() / cpu.norm() < 0.03
