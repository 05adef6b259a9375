"""Content-clustered attention: ``routing`` (Roy et al. 2021) and ``clustered`` (Vyas et al.
2020) against dense attention under explicit masks (:mod:`references`), at small T: one
cluster / a cluster per query is full attention, several clusters follow the papers'
definitions (routing's windows by absolute position, with more keys than queries), routing
stays causal with many small clusters and moves its centroids by the EMA formula once per
optimiser step, in training only, recomputed blocks (``model.checkpointing``) or not."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import compose_config, declared_refusals, seeded_model, seeded_tokens
from references import causal_mask, masked_softmax_attention, query_key_positions
from xformer_bench.attention.clustered import hamming_kmeans
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.core.dims import ModelDims
from xformer_bench.core.step_updates import apply_pending_updates
from xformer_bench.models.transformer_lm import TransformerLM
from xformer_bench.registry import ATTENTION

DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, d_ff=64, seq_len=16, vocab_size=256)


def qkv(t=16, s=16, heads=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, heads, t, 8, generator=g), torch.randn(2, heads, s, 8, generator=g),
            torch.randn(2, heads, s, 8, generator=g))


def routing(**kwargs):
    torch.manual_seed(0)
    return ATTENTION.get("routing")(DIMS, **{"local_fraction": 0.0, **kwargs})


def normed(x):
    return F.layer_norm(x, x.shape[-1:])


# -- routing --


@pytest.mark.parametrize(("t", "s"), [(16, 16), (10, 16)])
@pytest.mark.parametrize("causal", [True, False])
def test_routing_with_one_cluster_is_full_attention_over_normalised_queries_and_keys(t, s, causal):
    q, k, v = qkv(t, s)
    padding = torch.zeros(2, s, dtype=torch.bool)
    padding[1, :3] = True
    allowed = ~padding[:, None, None, :] & (causal_mask(t, s) if causal else True)
    kernel = routing(n_clusters=1).eval()
    out = kernel(q, k, v, causal=causal, key_padding_mask=padding)
    expected = masked_softmax_attention(normed(q), normed(k), v, allowed)  # no key: 0
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_routing_attends_within_clusters_as_the_paper_defines(causal):
    """window >= T: every query sees every key of its cluster (j <= i when causal)."""
    q, k, v = qkv()
    kernel = routing(n_clusters=3, window=16).eval()
    query_cluster, key_cluster = kernel.nearest(normed(q)), kernel.nearest(normed(k))
    assert len(query_cluster.unique()) > 1, "the test needs several clusters"
    allowed = query_cluster[..., :, None] == key_cluster[..., None, :]  # (B, H, T, S)
    if causal:
        allowed = allowed & causal_mask(16, 16)
    expected = masked_softmax_attention(normed(q), normed(k), v, allowed)  # no key: 0
    torch.testing.assert_close(kernel(q, k, v, causal=causal), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("t", "s"), [(12, 12), (5, 12)])
@pytest.mark.parametrize("causal", [True, False])
def test_routing_local_heads_attend_to_a_window_of_two_blocks(causal, t, s):
    """Blocks of 4 at absolute positions (the queries the last T): causal, the block and the
    previous one; bidirectional, 8 keys centred on the block, kept inside the sequence (0-7,
    2-9, 4-11)."""
    q, k, v = qkv(t, s)
    kernel = routing(local_fraction=1.0, local_window=4).eval()
    p, j = query_key_positions(t, s)
    first = p // 4 * 4  # the block's first position
    start = first - 4 if causal else (first - 2).clamp(0, s - 8)
    allowed = (j >= start) & (j < start + 8)
    allowed = allowed & causal_mask(t, s) if causal else allowed
    torch.testing.assert_close(kernel(q, k, v, causal=causal),
                               masked_softmax_attention(q, k, v, allowed), atol=1e-5, rtol=1e-5)


def routing_mask(query_cluster, key_cluster, window, causal):
    """(B, H, T, S): each query's cluster's keys, ranked by position, in blocks of ``window``
    counted from position 0; query p falls in the block of the number a of its cluster's keys
    before p and sees, of 2r (r = min(window, S)) ranks, its block and the previous one
    (causal, keys <= p) or those centred on its block's start, kept inside the cluster."""
    t, s = query_cluster.shape[-1], key_cluster.shape[-1]
    p, j = query_key_positions(t, s)
    same = query_cluster[..., :, None] == key_cluster[..., None, :]  # (B, H, T, S)
    rank = same.cumsum(-1) - 1  # each key's rank among the query's cluster's keys
    block_start = (same & (j < p)).sum(-1, keepdim=True) // window * window  # (B, H, T, 1)
    r = min(window, s)
    if causal:
        first = (block_start - r).clamp(min=0)
    else:
        first = (block_start - r // 2).minimum(same.sum(-1, keepdim=True) - 2 * r).clamp(min=0)
    allowed = same & (rank >= first) & (rank < first + 2 * r)
    return allowed & causal_mask(t, s) if causal else allowed


@pytest.mark.parametrize(("t", "s"), [(40, 40), (13, 40)])
@pytest.mark.parametrize("causal", [True, False])
def test_routing_sees_its_block_of_its_clusters_keys_and_the_previous_one(causal, t, s):
    """Blocks of 3 keys per cluster, 3 clusters, more keys than queries: the kernel's windows
    by absolute position, so the last T queries see what they see among all S."""
    q, k, v = qkv(t, s, seed=4)
    kernel = routing(n_clusters=3, window=3).eval()
    query_cluster, key_cluster = kernel.nearest(normed(q)), kernel.nearest(normed(k))
    counts = F.one_hot(key_cluster, 3).sum(2)  # (B, H, C)
    assert (counts > 2 * 3).any() and len(query_cluster.unique()) == 3, "windows must bite"
    allowed = routing_mask(query_cluster, key_cluster, 3, causal)
    expected = masked_softmax_attention(normed(q), normed(k), v, allowed)  # no key: 0
    torch.testing.assert_close(kernel(q, k, v, causal=causal), expected, atol=1e-5, rtol=1e-5)


def test_routing_with_small_clusters_never_sees_the_future():
    """Chunks of 3 queries per cluster, 5 clusters: what a query sees must not depend on later
    positions (the paper's top-k balancing would leak here)."""
    q, k, v = qkv(40, 40, seed=1)
    kernel = routing(n_clusters=5, window=3, local_fraction=0.5, local_window=4).eval()
    out = kernel(q, k, v, causal=True)
    for t in (0, 9, 25, 38):
        changed = [x.clone() for x in (q, k, v)]
        for x in changed:
            x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:])
        after = kernel(*changed, causal=True)
        assert torch.equal(after[:, :, : t + 1], out[:, :, : t + 1])
        assert not torch.allclose(after[:, :, t + 1:], out[:, :, t + 1:])


@pytest.mark.parametrize("causal", [True, False])
def test_no_query_reads_more_keys_than_routing_declares(causal):
    """``keys_per_query``, 2 x the wider block (routing 5, local 3 here), bounds the values that
    reach a query, and some query reaches it: the allocation test's plane length rests on it."""
    q, k, v = qkv(40, 40, seed=2)
    kernel = routing(n_clusters=2, window=5, local_fraction=0.5, local_window=3).eval()
    assert kernel.keys_per_query == 10
    v.requires_grad_()
    read = [(torch.autograd.grad(kernel(q, k, v, causal=causal)[:, :, i].sum(), v)[0] != 0)
            .any(-1).sum(-1).max() for i in range(40)]  # keys whose value reaches query i
    assert max(read) == kernel.keys_per_query


def test_a_routing_lm_with_many_clusters_is_causal():
    spec = {"name": "routing", "n_clusters": 4, "window": 4, "local_window": 4}
    torch.manual_seed(0)
    model = TransformerLM(DIMS, spec, {"name": "layernorm"}, {"name": "gelu"},
                          {"name": "sinusoidal"}).eval()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    for t in (3, 17, 30):
        changed = tokens.clone()
        changed[:, t + 1:] = (changed[:, t + 1:] + 17) % 256
        with torch.no_grad():
            torch.testing.assert_close(model(tokens)[:, : t + 1], model(changed)[:, : t + 1],
                                       atol=1e-5, rtol=1e-5)


def test_routing_centroids_move_by_the_ema_formula_after_a_training_step_only():
    """A training forward records the statistics and moves nothing; the update after the
    optimiser step applies the EMA formula once; eval records nothing."""
    q, k, v = qkv(seed=2)
    padding = torch.zeros(2, 16, dtype=torch.bool)
    padding[0, -4:] = True  # padded keys (and their queries) are left out of the statistics
    kernel = routing(n_clusters=3, decay=0.9)
    before = {name: b.clone() for name, b in kernel.named_buffers()}
    kernel.eval()(q, k, v, causal=True, key_padding_mask=padding)
    apply_pending_updates(kernel)
    assert all(torch.equal(b, before[name]) for name, b in kernel.named_buffers())

    kernel.train()(q, k, v, causal=True, key_padding_mask=padding)
    assert all(torch.equal(b, before[name]) for name, b in kernel.named_buffers())
    apply_pending_updates(kernel)
    kept = (~padding)[:, None, :, None].float()  # (B, 1, T, 1)
    mu = before["centroids"]  # (H, C, Dh)
    total_sum, total_count = torch.zeros_like(mu), torch.zeros(mu.shape[:2])
    for x in (normed(q), normed(k)):
        onehot = F.one_hot(torch.einsum("bhtd,hcd->bhtc", x, mu).argmax(-1), 3).float() * kept
        total_sum += torch.einsum("bhtc,bhtd->hcd", onehot, x) / 2  # (1 - lambda)/2 each
        total_count += onehot.sum((0, 2)) / 2
    ema_sum = 0.9 * before["ema_sum"] + 0.1 * total_sum
    ema_count = 0.9 * before["ema_count"] + 0.1 * total_count
    torch.testing.assert_close(kernel.ema_sum, ema_sum)
    torch.testing.assert_close(kernel.ema_count, ema_count)
    torch.testing.assert_close(kernel.centroids, ema_sum / ema_count[..., None])
    assert not torch.allclose(kernel.centroids, mu)
    moved = kernel.centroids.clone()
    apply_pending_updates(kernel)  # nothing recorded since: nothing moves
    assert torch.equal(kernel.centroids, moved)


ROUTING_LM = ("attention=routing", "attention.n_clusters=3", "attention.window=4",
              "model.d_model=32", "model.n_heads=2", "model.n_layers=2", "model.d_ff=64",
              "data.seq_len=16", "optim.warmup_steps=1")


def routing_lm(checkpointing: bool, decay: float):
    return seeded_model(*ROUTING_LM, f"attention.decay={decay}",
                        f"model.checkpointing={checkpointing}", vocab_size=64).train()


def centroids(model) -> list[torch.Tensor]:
    return [b.clone() for name, b in model.named_buffers() if name.endswith("centroids")]


def tokens_and_targets(batch: int = 4):
    tokens = seeded_tokens(batch=batch, length=17, vocab_size=64)
    return tokens[:, :-1], tokens[:, 1:]


def centroids_after_a_step(checkpointing: bool, decay: float, microbatches: int = 1):
    """The centroids after one optimiser step of a routing LM over ``microbatches``
    forward/backward passes (gradient accumulation), updated as the task does after it."""
    model = routing_lm(checkpointing, decay)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for inputs, targets in zip(*(x.chunk(microbatches) for x in tokens_and_targets())):
        F.nll_loss(model(inputs).flatten(0, 1), targets.flatten()).backward()
    optimizer.step()
    apply_pending_updates(model)
    return centroids(model)


def assert_all_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b) == 2  # one routing kernel per layer
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0)


@pytest.mark.parametrize("decay", [0.999, 0.5])
def test_checkpointing_moves_the_centroids_as_without_it(decay):
    """model.checkpointing recomputes each block's forward in backward: that replay must
    neither count the batch twice (the EMA count would grow twice as fast) nor see moved
    centroids (at decay 0.5 they move enough to change the clusters, so the replay saves other
    tensors: CheckpointError)."""
    plain = centroids_after_a_step(False, decay)
    assert all(not torch.allclose(a, b) for a, b in zip(plain, centroids(routing_lm(False, decay))))
    assert_all_close(centroids_after_a_step(True, decay), plain)


def test_micro_batches_of_one_step_pool_into_one_update():
    """Gradient accumulation: two forwards then one optimiser step move the centroids as one
    forward over both halves of the batch (each row is clustered on its own)."""
    assert_all_close(centroids_after_a_step(True, 0.5, microbatches=2),
                     centroids_after_a_step(False, 0.5))


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no")
def test_the_task_updates_the_centroids_after_its_optimiser_step():
    """A Lightning step of the LM task with recomputed blocks, decay 0.5: no CheckpointError,
    the centroids moved once, as by hand."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from xformer_bench.tasks.lm import LanguageModelTask

    model = routing_lm(True, 0.5)
    task = LanguageModelTask(model, compose_config(*ROUTING_LM)["optim"], max_steps=1)
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(task, train_dataloaders=DataLoader(TensorDataset(*tokens_and_targets()),
                                                   batch_size=4))
    assert_all_close(centroids(model), centroids_after_a_step(False, 0.5))


def test_routing_defaults_follow_the_authors_cluster_size():
    assert routing().n_clusters == 1  # data.seq_len 16 < 512: one cluster
    dims = ModelDims(d_model=64, n_heads=8, n_layers=2, d_ff=64, seq_len=8192, vocab_size=256)
    kernel = ATTENTION.get("routing")(dims)
    assert (kernel.n_clusters, kernel.local_heads) == (16, 4)  # enwik8_local_cluster8k
    assert kernel.centroids.shape == (4, 16, 8)


def test_routing_state_refuses_shared_blocks():
    config = compose_config("attention=routing", "model=shared_blocks", "data.seq_len=16")
    assert any("attention=routing needs a block of its own" in m for m in declared_refusals(config))


# -- clustered --


@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize(("t", "s"), [(16, 16), (10, 16)])
def test_clustered_with_as_many_clusters_as_queries_is_full_attention(improved, t, s):
    q, k, v = qkv(t, s)
    padding = torch.zeros(2, s, dtype=torch.bool)
    padding[1, :3] = True
    kernel = ATTENTION.get("clustered")(DIMS, n_clusters=t, improved=improved, topk=4).eval()
    out = kernel(q, k, v, causal=False, key_padding_mask=padding)
    expected = masked_softmax_attention(q, k, v, ~padding[:, None, None, :])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_improved_clustered_with_every_key_in_the_top_k_is_full_attention():
    q, k, v = qkv(32, 32)
    kernel = ATTENTION.get("clustered")(DIMS, n_clusters=3, topk=32).eval()
    torch.testing.assert_close(kernel(q, k, v, causal=False), masked_softmax_attention(q, k, v),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("improved", [False, True])
def test_clustered_follows_the_papers_equations(improved):
    q, k, v = qkv(32, 24, seed=3)
    kernel = ATTENTION.get("clustered")(DIMS, n_clusters=4, improved=improved, topk=5).eval()
    cluster, n = kernel.cluster(q, layer=0)
    assert n == 4 and len(cluster[0, 0].unique()) > 1
    member = F.one_hot(cluster, 4).float()  # (B, H, T, C)
    centroids = member.transpose(-1, -2) @ q / member.sum(2)[..., None].clamp(min=1)  # (B,H,C,Dh)
    a_c = ((centroids @ k.transpose(-1, -2)) / math.sqrt(8)).softmax(-1)  # (B, H, C, S)
    a = member @ a_c  # (B, H, T, S): each query's cluster's attention
    if improved:
        top = F.one_hot(a_c.topk(5, dim=-1).indices, 24).sum(-2).bool()  # (B, H, C, S)
        top = (member @ top.float()).bool()  # (B, H, T, S)
        mass = (a * top).sum(-1, keepdim=True)  # m_j
        exact = ((q @ k.transpose(-1, -2)) / math.sqrt(8)).masked_fill(~top, float("-inf"))
        a = torch.where(top, mass * exact.softmax(-1), a)
    torch.testing.assert_close(kernel(q, k, v, causal=False), a @ v, atol=1e-5, rtol=1e-5)


def test_hamming_kmeans_recovers_separated_clusters():
    g = torch.Generator().manual_seed(0)
    prototypes = torch.randint(0, 2, (3, 63), generator=g).float()
    truth = torch.arange(30) % 3
    flips = torch.rand(30, 63, generator=g) < 0.05
    hashes = (prototypes[truth] + flips.float()) % 2  # (N, bits)
    found = hamming_kmeans(hashes[None, None], n_clusters=3, iterations=10)[0, 0]
    pairs = truth[:, None] == truth[None, :]
    assert torch.equal(found[:, None] == found[None, :], pairs)


def test_clustered_hyperplanes_are_fixed_in_eval_and_redrawn_in_training():
    q = qkv(64)[0]
    kernel = ATTENTION.get("clustered")(DIMS).eval()
    assert torch.equal(kernel.hash(q, layer=1), kernel.hash(q, layer=1))
    assert not torch.equal(kernel.hash(q, layer=1), kernel.hash(q, layer=0))
    kernel.train()
    assert not torch.equal(kernel.hash(q, layer=1), kernel.hash(q, layer=1))


def test_clustered_is_refused_in_the_decoder_lm():
    with pytest.raises(ConfigError, match="needs causal .* attention=clustered does not provide"):
        build_model(compose_config("attention=clustered", "data.seq_len=16"), vocab_size=256)


def test_one_clusters_chunk_count_from_the_shapes_is_the_one_counted_on_the_device():
    """Routing's local heads (one cluster) lay out their chunks without reading the count back
    from the device (tests/test_host_sync.py): the count from the shapes is the counted one."""
    from xformer_bench.attention._ops.clustering import chunk_by_cluster, one_cluster_chunks

    for s in (1, 5, 16, 17, 33):
        for t in sorted({1, min(2, s), s // 2 or 1, s - 1 or 1, s}):
            for chunk in (1, 3, 4, 16, 64):
                block = ((s - t + torch.arange(t)) // chunk).expand(1, 1, t)
                layout, _ = chunk_by_cluster(block, -(-s // chunk), chunk)
                assert one_cluster_chunks(t, s, chunk) == layout.shape[-2], (t, s, chunk)
