"""Linearised attention (``linear``, ``performer``) against the shared references
(references.py): the explicit kernel formula out_i = phi(q_i) sum_j phi(k_j) v_j^T /
phi(q_i) sum_j phi(k_j) over a dense (T, S) weight matrix and, causal, the running-sum
recurrence; FAVOR+'s convergence to softmax attention as the features grow, the
stabilised prefix sums' causality, and the redraw schedule of the random features."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from references import kernel_attention, kernel_attention_recurrence
from xformer_bench.attention._ops.feature_maps import feature_attention
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION

DIMS = ModelDims(d_model=32, n_heads=2, n_layers=2, d_ff=64, seq_len=32, vocab_size=256)


def recurrence_over_keys(phi_q, phi_k, v, key_padding_mask=None, eps=1e-6):
    """Causal linear attention of the last T of S positions through the shared recurrence run
    over all S: the S - T earlier positions get placeholder queries whose outputs are dropped;
    a padded key has zero features, so it adds nothing to either running sum."""
    t, s = phi_q.shape[-2], phi_k.shape[-2]
    if key_padding_mask is not None:
        phi_k = phi_k * ~key_padding_mask[:, None, :, None]
    queries = torch.cat([torch.ones_like(phi_k[..., : s - t, :]), phi_q], -2)  # (B, H, S, F)
    return kernel_attention_recurrence(queries, phi_k, v, eps)[..., s - t:, :]


def qkv(t=19, s=23, dh=8, scale=1.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, t, dh, generator=g, dtype=dtype) * scale  # (B, H, T, Dh)
    k, v = (torch.randn(2, 2, s, dh, generator=g, dtype=dtype) * c for c in (scale, 1.0))
    return q, k, v


def padding(s=23):
    mask = torch.zeros(2, s, dtype=torch.bool)  # (B, S)
    mask[1, :4] = True  # memory keys
    mask[1, 9:12] = True  # keys among the queries'
    return mask


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_linear_equals_the_explicit_kernel_formula(causal, chunk_size):
    """19 queries over 23 keys (4 of memory), chunks that do not divide T, padded keys."""
    q, k, v = qkv()
    kernel = ATTENTION.get("linear")(DIMS, chunk_size=chunk_size)
    phi = lambda x: F.elu(x) + 1  # noqa: E731 -- Katharopoulos et al. eq. 7
    for mask in (None, padding()):
        expected = kernel_attention(phi(q), phi(k), v, causal=causal, padding=mask)
        out = kernel(q, k, v, causal=causal, key_padding_mask=mask)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
        if causal:
            torch.testing.assert_close(out, recurrence_over_keys(phi(q), phi(k), v, mask),
                                       atol=1e-10, rtol=1e-10)


def favor_features(x, w, kernel):
    """FAVOR+ features written out plainly (small inputs: no overflow to guard against), with
    the authors' additive stabilisers: 1e-3 (ReLU), 1e-6 of the row's largest (softmax)."""
    m = w.shape[0]
    if kernel == "relu":
        return torch.relu(x @ w.T) / math.sqrt(m) + 1e-3
    x = x * x.shape[-1] ** -0.25
    exact = torch.exp(x @ w.T - x.square().sum(-1, keepdim=True) / 2)  # (B, H, L, m)
    return (exact + 1e-6 * exact.amax(-1, keepdim=True)) / math.sqrt(m)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_performer_equals_the_explicit_formula_with_its_features(causal, kernel):
    """The stabilised, chunked computation is exactly linear attention over phi(q), phi(k)."""
    torch.manual_seed(0)
    layer = ATTENTION.get("performer")(DIMS, n_features=40, kernel=kernel, chunk_size=6).eval()
    q, k, v = qkv(dh=DIMS.head_dim, scale=0.7)
    w = layer.features.double()
    for mask in (None, padding()):
        phi_q, phi_k = favor_features(q, w, kernel), favor_features(k, w, kernel)
        expected = kernel_attention(phi_q, phi_k, v, causal=causal, padding=mask, eps=0.0)
        out = layer(q, k, v, causal=causal, key_padding_mask=mask)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        if causal:
            torch.testing.assert_close(out, recurrence_over_keys(phi_q, phi_k, v, mask, eps=0.0),
                                       atol=1e-5, rtol=1e-5)


def test_performer_error_against_softmax_falls_as_features_grow():
    """Mean relative error against exact softmax attention over 3 seeds, causal and not: at
    m = 16, 64, 256 measured 0.49, 0.31, 0.18 (causal) and 0.66, 0.41, 0.26 (bidirectional)."""
    q, k, v = qkv(t=64, s=64, dh=32, scale=0.5, dtype=torch.float32)
    dims = ModelDims(d_model=64, n_heads=2, n_layers=2, d_ff=64, seq_len=64, vocab_size=256)
    for causal in (True, False):
        exact = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        errors = []
        for m in (16, 64, 256):
            total = 0.0
            for seed in range(3):
                torch.manual_seed(seed)
                layer = ATTENTION.get("performer")(dims, n_features=m).eval()
                total += ((layer(q, k, v, causal=causal) - exact).norm() / exact.norm()).item()
            errors.append(total / 3)
        assert errors[1] < 0.8 * errors[0] and errors[2] < 0.8 * errors[1], errors


def test_a_huge_future_key_leaves_the_past_exactly_unchanged():
    """The key stabiliser is a running maximum: a future key whose features dwarf the rest
    (exp of a large exponent) changes neither the past's outputs nor their rounding."""
    torch.manual_seed(0)
    layer = ATTENTION.get("performer")(DIMS, chunk_size=8).eval()
    q, k, v = qkv(t=32, s=32, dh=DIMS.head_dim, dtype=torch.float32)
    loud = k.clone()
    loud[..., 20:, :] *= 40  # exponents of several hundred: exp overflows unstabilised
    quiet, changed = layer(q, k, v, causal=True), layer(q, loud, v, causal=True)
    assert torch.isfinite(changed).all()
    torch.testing.assert_close(changed[..., :20, :], quiet[..., :20, :], atol=0, rtol=0)
    assert not torch.allclose(changed[..., 20:, :], quiet[..., 20:, :])


def test_key_scales_with_no_key_and_memory_only_padding_give_zero_not_nan():
    phi_q = torch.rand(1, 1, 5, 4)  # (B, H, T, F)
    phi_k, scale = torch.rand(1, 1, 8, 4), torch.randn(1, 1, 8) * 50  # (B, H, S, F), (B, H, S)
    v = torch.randn(1, 1, 8, 3)
    mask = torch.ones(1, 8, dtype=torch.bool)
    for causal in (True, False):
        out = feature_attention(phi_q, phi_k, v, causal=causal, chunk=2, key_log_scale=scale,
                                key_padding_mask=mask)
        assert torch.equal(out, torch.zeros(1, 1, 5, 3))


def train_step(layer, q, k, v) -> None:
    """One training step of the layer as the Task drives it: what is due before the batch, the
    forward, the optimiser step's count."""
    layer.train().before_training_step()
    layer(q, k, v, causal=True)
    layer.apply_pending_updates()


def test_features_are_redrawn_every_interval_before_training_and_never_in_eval():
    torch.manual_seed(3)
    layer = ATTENTION.get("performer")(DIMS, n_features=8, redraw_interval=3)
    q, k, v = qkv(t=4, s=4, dh=DIMS.head_dim, dtype=torch.float32)
    drawn = [layer.features.clone()]
    for _ in range(3):  # evaluation: neither redraws nor counts
        layer.eval()(q, k, v, causal=True)
        layer.before_training_step()  # nothing counted: nothing due
    assert torch.equal(layer.features, drawn[0]) and int(layer.steps) == 0
    for step in range(8):
        train_step(layer, q, k, v)
        drawn.append(layer.features.clone())  # what an evaluation after this step uses
        layer.eval()(q, k, v, causal=True)
        layer.apply_pending_updates()  # in evaluation: nothing
        assert torch.equal(layer.features, drawn[-1])
    changed = [i for i in range(1, 9) if not torch.equal(drawn[i], drawn[i - 1])]
    assert changed == [4, 7]  # steps 4 and 7 train with redraws 1 and 2; evaluations after
    assert int(layer.steps) == 8  # (so evaluations after steps 3 and 6 see what they used)
    torch.testing.assert_close(layer.features, layer.draw(2), atol=0, rtol=0)
    # reproducible from the seed: a fresh layer (another seed) restored from the state dict
    torch.manual_seed(4)
    restored = ATTENTION.get("performer")(DIMS, n_features=8, redraw_interval=3)
    assert not torch.equal(restored.features, layer.features)
    restored.load_state_dict(layer.state_dict())
    torch.testing.assert_close(restored.eval()(q, k, v, causal=False),
                               layer.eval()(q, k, v, causal=False), atol=0, rtol=0)
    for module in (layer, restored):
        for _ in range(2):  # step 9: none due; step 10: redraw 3
            train_step(module, q, k, v)
    torch.testing.assert_close(restored.features, layer.features, atol=0, rtol=0)
    torch.testing.assert_close(layer.features, layer.draw(3), atol=0, rtol=0)


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no")
def test_the_task_redraws_before_a_training_step_so_the_final_evaluation_scores_the_last_draw():
    """Lightning, 4 steps, interval 2: step 3 trains with redraw 1; after step 4 no redraw (none
    would be used), so the final evaluation scores the features the last step trained with."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from conftest import compose_config, seeded_model, seeded_tokens
    from xformer_bench.tasks.lm import LanguageModelTask

    overrides = ("attention=performer", "attention.redraw_interval=2", "attention.n_features=8",
                 "model.d_model=16", "model.n_layers=1", "model.d_ff=16", "data.seq_len=8")
    model = seeded_model(*overrides)
    task = LanguageModelTask(model, compose_config(*overrides)["optim"], max_steps=4)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0)
    tokens = seeded_tokens(batch=16, length=9)
    trainer.fit(task, train_dataloaders=DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]),
                                                   batch_size=4))
    [layer] = [m for m in model.modules() if hasattr(m, "before_training_step")]
    assert int(layer.steps) == 4
    torch.testing.assert_close(layer.features, layer.draw(1), atol=0, rtol=0)


def test_random_features_are_orthogonal_blocks_with_gaussian_norms():
    from xformer_bench.attention.performer import orthogonal_gaussian

    w = orthogonal_gaussian(40, 16, torch.Generator().manual_seed(0)).double()  # (m, d)
    for block in (w[:16], w[16:32], w[32:]):
        gram = block @ block.T
        torch.testing.assert_close(gram, torch.diag(gram.diagonal()), atol=1e-5, rtol=0)
    norms = orthogonal_gaussian(4096, 16, torch.Generator().manual_seed(1)).norm(dim=1)
    assert abs(norms.square().mean().item() - 16) < 0.5  # E|w|^2 = d for w ~ N(0, I_d)
