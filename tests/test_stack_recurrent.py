"""Transformer-XL (Dai et al. 2019): the recurrent stack against a hand-written reference of its
recurrence, the xl_relative logits against the paper's four terms, the streamed data, the
refusals, the memory's life cycle and a whole run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import compose_config, run_tiny
from xformer_bench.data.byte_windows import ByteLMDataModule, StreamWindows
from xformer_bench.data.eval_streams import StreamEvalWindows
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.position.xl_relative import XLRelativePosition
from xformer_bench.targets import IGNORE_INDEX

T = 8  # segment length
SMALL = (f"data.seq_len={T}", "model.d_model=16", "model.n_heads=2", "model.d_ff=32")


def xl_model(*overrides: str, n_layers: int = 2) -> torch.nn.Module:
    config = compose_config("model=transformer_xl", *SMALL, f"model.n_layers={n_layers}", *overrides)
    torch.manual_seed(0)
    model = build_model(config, vocab_size=256).eval()
    for p in model.position.parameters():  # larger than at init: a misplaced term would show
        torch.nn.init.normal_(p, std=0.5)
    return model


def standard_twin(model: torch.nn.Module, *overrides: str) -> torch.nn.Module:
    """The same weights under ``stack=standard`` (no memory)."""
    config = compose_config("model=transformer_xl", *SMALL, f"model.n_layers={model.dims.n_layers}",
                            "stack=standard", *overrides)
    twin = build_model(config, vocab_size=256).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def segments(n: int, batch: int = 2, seed: int = 0) -> list[torch.Tensor]:
    tokens = torch.randint(0, 256, (batch, n * T), generator=torch.Generator().manual_seed(seed))
    return list(tokens.split(T, dim=1))  # n x (B, T)


def xl_reference(model: torch.nn.Module, segs: list[torch.Tensor], mem_len: int) -> torch.Tensor:
    """Log-probs of the last segment by Dai et al.'s recurrence, written out with the blocks'
    plain (memory-less) forward: layer l of a segment is the block applied to
    ``[memory_l; h_{l-1}]``, its last T outputs kept; memory_l is then the last ``mem_len`` of
    ``[memory_l; h_{l-1}]``."""
    stack, memory = model.stack, [None] * model.dims.n_layers
    for seg in segs:
        x = model.position.embed(model.embedding(seg))  # (B, T, D)
        for i in range(model.dims.n_layers):
            ctx = ForwardContext(model.position, layer=0 if stack.share_blocks else i)
            extended = x if memory[i] is None else torch.cat([memory[i], x], dim=1)  # (B, M+T, D)
            memory[i] = extended[:, -mem_len:]
            x = stack.blocks[ctx.layer](extended, ctx)[:, -x.shape[1]:]  # (B, T, D)
    return model.head(model.final_norm(x))


# --------------------------------------------------------------------------- the recurrence


@pytest.mark.parametrize("position", ["xl_relative", "rotary", "t5", "alibi"])
def test_one_layer_second_segment_equals_the_causal_model_on_both_segments(position):
    """The done-when: with memory = T, segment 2's queries see segment 1 and their own segment
    causally -- the non-recurrent model's last T positions over [segment 1; segment 2]."""
    model = xl_model(f"position={position}", n_layers=1)
    seg1, seg2 = segments(2)
    with torch.no_grad():
        model(seg1)
        recurrent = model(seg2)  # (B, T, V)
        full = standard_twin(model, f"position={position}")(torch.cat([seg1, seg2], dim=1))
    torch.testing.assert_close(recurrent, full[:, T:], atol=1e-5, rtol=1e-5)


def test_absolute_positions_restart_in_every_segment():
    """With sinusoidal positions segment 2 is encoded at positions 0..T-1 again, its memory at
    the same ones: not the model over [segment 1; segment 2] (why XL has relative positions)."""
    model = xl_model("position=sinusoidal", n_layers=1)
    seg1, seg2 = segments(2)
    with torch.no_grad():
        model(seg1)
        recurrent = model(seg2)
        full = standard_twin(model, "position=sinusoidal")(torch.cat([seg1, seg2], dim=1))
        assert not torch.allclose(recurrent, full[:, T:], atol=1e-3)
        torch.testing.assert_close(recurrent, xl_reference(model, [seg1, seg2], T))


@pytest.mark.parametrize("overrides,mem_len", [
    ((), T),
    (("stack.mem_len=12",), 12),  # longer than a segment: memory of two segments, truncated
    (("stack.mem_len=5", "model.share_blocks=true"), 5),  # one block, a memory per application
    (("stack.mem_len=5", "position=rotary", "model.norm_placement=post"), 5),
])
def test_deep_model_follows_xl_recurrence_over_three_segments(overrides, mem_len):
    model = xl_model(*overrides, n_layers=3)
    segs = segments(3)
    with torch.no_grad():
        outputs = [model(seg) for seg in segs]
        torch.testing.assert_close(outputs[-1], xl_reference(model, segs, mem_len),
                                   atol=1e-5, rtol=1e-5)
    assert [m.shape[1] for m in model.stack.memory()] == [mem_len] * 3


def test_first_segment_and_zero_memory_equal_the_standard_stack():
    model = xl_model()
    seg1, seg2 = segments(2)
    twin = standard_twin(model)
    with torch.no_grad():
        torch.testing.assert_close(model(seg1), twin(seg1), rtol=0, atol=0)
        no_memory = xl_model("stack.mem_len=0")
        no_memory(seg1)
        torch.testing.assert_close(no_memory(seg2), twin(seg2), rtol=0, atol=0)


def test_no_gradient_flows_into_the_memory():
    model = xl_model().train()
    seg1, seg2 = segments(2)
    loss1 = model(seg1).mean()
    assert all(not m.requires_grad and m.grad_fn is None for m in model.stack.memory())
    model(seg2).mean().backward()
    # segment 2's backward did not reach segment 1's graph: it is still whole
    loss1.backward()


def test_checkpointing_recomputes_each_block_with_its_own_memory():
    grads = []
    for checkpointing in ("false", "true"):
        model = xl_model(f"model.checkpointing={checkpointing}", n_layers=3).train()
        seg1, seg2 = segments(2)
        model(seg1)
        log_p = model(seg2)  # (B, T, V)
        log_p[..., :T].sum().backward()  # the log-probs of a few bytes
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for plain, recomputed in zip(*grads):
        torch.testing.assert_close(plain, recomputed, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------- memory's life


def test_reset_memory_gives_a_fresh_models_output():
    model, fresh = xl_model(), xl_model()
    seg1, seg2 = segments(2)
    with torch.no_grad():
        model(seg1)
        remembered = model(seg2)
        model.reset_memory()
        again = model(seg2)
        torch.testing.assert_close(again, fresh(seg2), rtol=0, atol=0)
    assert not torch.allclose(remembered, again)


def test_memory_is_dropped_for_another_batch_size_and_kept_per_mode():
    model, fresh = xl_model(), xl_model()
    seg1, seg2 = segments(2)
    other = segments(1, batch=3, seed=1)[0]
    with torch.no_grad():
        model(seg1)
        torch.testing.assert_close(model(other), fresh(other), rtol=0, atol=0)  # B 2 -> 3
        model.train()
        fresh.train()
        model(seg1)
        model.eval()  # a validation in between: its own streams, its own memory
        model.reset_memory(training=False)
        model(other)
        model.train()
        torch.testing.assert_close(model(seg2), xl_reference(fresh, [seg1, seg2], T),
                                   atol=1e-5, rtol=1e-5)


def test_evaluation_keeps_eval_mem_len_states():
    model = xl_model("stack.mem_len=4", "stack.eval_mem_len=12")
    segs = segments(2)
    with torch.no_grad():
        model(segs[0])
        assert [m.shape[1] for m in model.stack.memory()] == [T, T]
        model(segs[1])
        assert [m.shape[1] for m in model.stack.memory()] == [12, 12]
        model.train()
        model(segs[0])
        assert [m.shape[1] for m in model.stack.memory()] == [4, 4]
    assert "memory" not in " ".join(model.state_dict())  # not saved in checkpoints


# --------------------------------------------------------------------------- xl_relative


def test_xl_relative_logits_are_the_papers_four_terms():
    """B=1, H=2, T=3 queries over S=5 keys (2 of memory), every term by hand:
    (q_i.k_j + q_i.W R_{i-j} + u.k_j + v.W R_{i-j}) / sqrt(Dh)."""
    torch.manual_seed(0)
    dims = ModelDims(d_model=8, n_heads=2, n_layers=2, d_ff=16, seq_len=3, vocab_size=256)
    position = XLRelativePosition(dims, shared_biases=False)
    for p in position.parameters():
        torch.nn.init.normal_(p)
    h, dh, t, s, layer = 2, 4, 3, 5, 1
    q, k = torch.randn(1, h, t, dh), torch.randn(1, h, s, dh)
    w, u, v = (position.key_projection.weight[layer], position.u.weight[layer],
               position.v.weight[layer])  # (D, D), (H, Dh), (H, Dh)
    expected = torch.empty(1, h, t, s)
    for i in range(t):
        for j in range(s):
            distance = (i + s - t) - j
            r = torch.tensor([math.sin(distance / 10000 ** (2 * p / 8)) for p in range(4)]
                             + [math.cos(distance / 10000 ** (2 * p / 8)) for p in range(4)])
            w_r = (r @ w).view(h, dh)  # W_{k,R} R_{i-j}, per head
            for head in range(h):
                a = q[0, head, i] @ k[0, head, j]
                b = q[0, head, i] @ w_r[head]
                c = u[head] @ k[0, head, j]
                d = v[head] @ w_r[head]
                expected[0, head, i, j] = (a + b + c + d) / math.sqrt(dh)
    bias = position.bias(t, s, layer=layer, query=q, key=k).dense()  # (1, H, T, S)
    torch.testing.assert_close(q @ k.transpose(-1, -2) / math.sqrt(dh) + bias, expected,
                               atol=1e-5, rtol=1e-5)


def test_xl_relative_adds_no_embedding_and_needs_an_additive_bias():
    dims = ModelDims(d_model=8, n_heads=2, n_layers=1, d_ff=16, seq_len=3, vocab_size=256)
    x = torch.randn(1, 3, 8)
    assert torch.equal(XLRelativePosition(dims).embed(x), x)
    assert XLRelativePosition.requires == {"attention": {"additive_bias"}}


# --------------------------------------------------------------------------- streams


def _offset(row: torch.Tensor, data: np.ndarray) -> int:
    """Where the bytes of ``row`` lie in ``data`` (random bytes: one place)."""
    windows = np.lib.stride_tricks.sliding_window_view(data, len(row))
    (found,) = np.nonzero((windows == row.numpy()).all(axis=1))
    assert len(found) == 1
    return int(found[0])


def test_training_streams_continue_each_rows_text_from_step_to_step():
    data = np.random.default_rng(0).integers(0, 256, 4000).astype(np.uint8)
    stream = StreamWindows(data, 16, 4, seed=3, steps=100)
    lane_len = (len(data) - 1) // 4
    offsets = []
    for step in range(2 * stream.segments + 1):
        inputs, targets = stream[step]
        assert torch.equal(inputs[:, 1:], targets[:, :-1])
        offsets.append([_offset(row, data) for row in inputs])
    offsets = np.array(offsets)  # (steps, B)
    assert all(b * lane_len <= o < (b + 1) * lane_len for b, o in enumerate(offsets.min(0)))
    moves = np.diff(offsets, axis=0)  # (steps - 1, B)
    seams = (moves != 16).all(axis=1)  # a lane starting over: all rows at once
    assert ((moves == 16).all(axis=1) | seams).all()
    assert seams.sum() == 2  # once per pass over the lanes
    repeat = StreamWindows(data, 16, 4, seed=3, steps=100)
    assert torch.equal(repeat[7][0], stream[7][0])  # deterministic in (seed, step)
    assert not torch.equal(StreamWindows(data, 16, 4, seed=4, steps=100)[7][0], stream[7][0])


def test_training_streams_refuse_a_split_too_short_for_the_lanes():
    with pytest.raises(ConfigError, match="data.batch_size"):
        StreamWindows(np.zeros(100, np.uint8), 16, 8, seed=0, steps=1)


@pytest.mark.parametrize("n_bytes,seq_len,batch", [(1000, 16, 4), (17, 16, 4), (333, 7, 5), (2, 4, 3)])
def test_evaluation_streams_score_every_byte_once_lane_by_lane(n_bytes, seq_len, batch):
    data = np.random.default_rng(1).integers(0, 256, n_bytes).astype(np.uint8)
    shards = [StreamEvalWindows(data, seq_len, batch, shard=r, n_shards=2) for r in range(2)]
    assert len(shards[0]) == len(shards[1])  # every rank walks as many windows
    lanes = []
    for windows in shards:
        batches = [windows[j] for j in range(len(windows))]
        for inputs, targets in batches:
            assert inputs.shape == targets.shape == (batch, seq_len)
        for b in range(batch):  # a lane's windows continue each other
            inputs = torch.cat([x[b] for x, _ in batches]) if batches else torch.empty(0)
            targets = torch.cat([y[b] for _, y in batches]) if batches else torch.empty(0)
            scored = targets != IGNORE_INDEX
            if scored.any():
                assert torch.equal(inputs[1:][scored[:-1]], targets[:-1][scored[:-1]])
            lanes.append(targets[scored])
    assert torch.equal(torch.cat(lanes).long(), torch.from_numpy(data[1:].astype(np.int64)))


def test_the_datamodule_streams_and_says_so():
    splits = {name: np.zeros(500, np.uint8) for name in ("train", "val", "test")}
    module = ByteLMDataModule(splits, seq_len=16, batch_size=2, seed=0, eval_batch_size=3)
    module.use_streams(memory=24)
    assert module.eval_protocol() == {"windows": "streams", "seq_len": 16, "stride": 16,
                                      "min_context": 0, "lanes": 3, "memory": 24, "warmup": None}
    assert isinstance(module.train_dataloader().dataset, StreamWindows)
    assert isinstance(module.val_dataloader().dataset, StreamEvalWindows)
    strided = ByteLMDataModule(splits, seq_len=16, batch_size=2, seed=0)
    strided.evaluate_with_stride(4)
    with pytest.raises(ConfigError, match="remove eval.stride"):
        strided.use_streams(memory=16)


# --------------------------------------------------------------------------- refusals and a run


def test_residual_attention_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="model.residual_attention=true"):
        build_model(compose_config("model=realformer", "stack=recurrent", *SMALL), vocab_size=256)


def test_a_transformer_xl_run_streams_and_evaluates_with_memory(tmp_path):
    from xformer_bench.run import _build_datamodule

    record = run_tiny(tmp_path, "model=transformer_xl", "trainer.max_steps=2")
    assert record["status"] == "finished"
    assert record["eval_protocol"]["windows"] == "streams"
    assert record["eval_protocol"]["memory"] == 32  # stack.eval_mem_len: null = data.seq_len
    splits = _build_datamodule(compose_config("data.size=20000")).splits
    assert record["eval_counts"] == {"val": len(splits["val"]) - 1, "test": len(splits["test"]) - 1}
