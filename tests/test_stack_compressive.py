"""The Compressive Transformer (Rae et al. 2020): memory and compressed-memory shapes, the
compression functions against their definitions, the stack against a hand-written reference of
its recurrence (attention over [cmem; mem; x]), its reduction to Transformer-XL, the
attention-reconstruction loss by hand and where its gradient goes, causality, refusals, a run."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import compose_config, run_tiny
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.stacks._compression import build_compressor

T, D, H = 4, 16, 2  # segment length, width, heads
SMALL = (f"data.seq_len={T}", f"model.d_model={D}", f"model.n_heads={H}", "model.d_ff=32")


def compressive_model(*overrides: str, n_layers: int = 2, mem_len: int = 4, rate: int = 2,
                      cmem_len: int = 3) -> torch.nn.Module:
    config = compose_config("model=compressive_transformer", *SMALL, f"model.n_layers={n_layers}",
                            f"stack.mem_len={mem_len}", f"stack.compression_rate={rate}",
                            f"stack.cmem_len={cmem_len}", *overrides)
    torch.manual_seed(0)
    model = build_model(config, vocab_size=256).eval()
    for p in model.position.parameters():  # larger than at init: a misplaced term would show
        torch.nn.init.normal_(p, std=0.5)
    return model


def segments(n: int, batch: int = 2, seed: int = 0) -> list[torch.Tensor]:
    tokens = torch.randint(0, 256, (batch, n * T), generator=torch.Generator().manual_seed(seed))
    return list(tokens.split(T, dim=1))  # n x (B, T)


def lengths(model) -> tuple[list[int], list[int]]:
    return ([m.shape[1] for m in model.stack.memory()],
            [c.shape[1] for c in model.stack.compressed_memory()])


def compress_by_hand(model, layer: int, old: torch.Tensor, compression: str, c: int):
    """f_c by its definition: (B, n, D) -> (B, n / c, D)."""
    groups = old.unflatten(1, (-1, c))  # (B, n / c, c, D)
    if compression == "mean_pool":
        return groups.mean(dim=2)
    if compression == "max_pool":
        return groups.amax(dim=2)
    conv = model.stack.compressors[layer].conv  # slot j = sum_tap W[:, :, tap] old[j c + tap] + b
    return torch.einsum("bjtd,edt->bje", groups, conv.weight) + conv.bias


def reference(model, segs, mem_len: int, cmem_len: int, c: int, compression: str):
    """Log-probs of the last segment by Algorithm 1, written out with the blocks' plain
    (memory-less) forward over [cm; m; x], the last T outputs kept."""
    stack, n = model.stack, model.dims.n_layers
    memory, compressed = [None] * n, [None] * n
    for seg in segs:
        x = model.position.embed(model.embedding(seg))  # (B, T, D)
        for i in range(n):
            layer = 0 if stack.share_blocks else i
            ctx = ForwardContext(model.position, layer=layer)
            parts = [t for t in (compressed[i], memory[i], x) if t is not None]
            y = stack.blocks[layer](torch.cat(parts, dim=1), ctx)[:, -T:]  # (B, T, D)
            states = x if memory[i] is None else torch.cat([memory[i], x], dim=1)
            overflow = max(0, states.shape[1] - mem_len)
            n_old = overflow - overflow % c
            if n_old:
                new = compress_by_hand(model, layer, states[:, :n_old], compression, c)
                cm = new if compressed[i] is None else torch.cat([compressed[i], new], dim=1)
                compressed[i] = cm[:, -cmem_len:]
            memory[i], x = states[:, n_old:], y
    return model.head(model.final_norm(x))


def qkv_by_hand(block, x: torch.Tensor) -> list[torch.Tensor]:
    """Queries, keys, values (B, H, S, Dh) of the block's attention on its input norm of x."""
    w, b = block.attention.qkv.weight, block.attention.qkv.bias  # (3 D, D), (3 D,)
    y = block.norms["attention"]["input"](x) @ w.T + b  # (B, S, 3 D)
    return [z.view(x.shape[0], x.shape[1], H, D // H).transpose(1, 2) for z in y.split(D, dim=-1)]


def captured_inputs(model, tokens: torch.Tensor) -> torch.Tensor:
    """The first block's input (B, T, D) while the model reads ``tokens``."""
    inputs = []
    hook = model.stack.blocks[0].register_forward_pre_hook(
        lambda _, args: inputs.append(args[0].detach()))
    model(tokens)
    hook.remove()
    return inputs[0]


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("mem_len,rate,cmem_len,expected", [
    (4, 2, 3, [([4, 4], [0, 0]), ([4, 4], [2, 2]), ([4, 4], [3, 3]), ([4, 4], [3, 3])]),
    (8, 2, 9, [([4, 4], [0, 0]), ([8, 8], [0, 0]), ([8, 8], [2, 2]), ([8, 8], [4, 4])]),
    # c does not divide the overflow: the remainder waits in the memory for the next segment
    (4, 3, 9, [([4, 4], [0, 0]), ([5, 5], [1, 1]), ([6, 6], [2, 2]), ([4, 4], [4, 4])]),
])
def test_memory_and_compressed_memory_lengths_after_each_segment(mem_len, rate, cmem_len,
                                                                 expected):
    model = compressive_model(mem_len=mem_len, rate=rate, cmem_len=cmem_len)
    with torch.no_grad():
        for seg, lens in zip(segments(len(expected)), expected):
            model(seg)
            assert lengths(model) == lens


def test_evaluation_keeps_its_own_lengths_and_memories_are_detached():
    model = compressive_model("stack.eval_mem_len=8", "stack.eval_cmem_len=1")
    segs = segments(4)
    with torch.no_grad():
        for seg in segs:
            model(seg)
    assert lengths(model) == ([8, 8], [1, 1])
    model.train()
    for seg in segs[:3]:
        model(seg)
    assert lengths(model) == ([4, 4], [3, 3])
    assert all(t.grad_fn is None and not t.requires_grad
               for t in model.stack.memory() + model.stack.compressed_memory())
    assert "memory" not in " ".join(model.state_dict())  # not saved in checkpoints


# --------------------------------------------------------------------------- compression


def test_pooling_and_conv_equal_their_definitions():
    old = torch.tensor([[[1., 2.], [3., 0.], [5., 6.], [-1., 8.]]])  # (B=1, n=4, D=2)
    mean = build_compressor("mean_pool", 2, 2)(old)
    torch.testing.assert_close(mean, torch.tensor([[[2., 1.], [2., 7.]]]))
    maximum = build_compressor("max_pool", 2, 2)(old)
    torch.testing.assert_close(maximum, torch.tensor([[[3., 2.], [5., 8.]]]))
    conv = build_compressor("conv", 2, 2)
    w, b = conv.conv.weight, conv.conv.bias  # (D, D, c), (D,)
    by_hand = torch.stack([w[:, :, 0] @ old[0, 2 * j] + w[:, :, 1] @ old[0, 2 * j + 1] + b
                           for j in range(2)])[None]  # slot j from states 2 j, 2 j + 1
    torch.testing.assert_close(conv(old), by_hand)
    torch.testing.assert_close(conv(old), F.conv1d(old.mT, w, b, stride=2).mT)


def test_most_used_keeps_the_most_attended_states_in_time_order():
    old = torch.arange(8.).view(2, 4, 1)  # (B=2, n=4, D=1): state k of row b is 4 b + k
    usage = torch.tensor([[0.1, 0.5, 0.2, 0.4], [0.5, 0.1, 0.2, 0.4]])
    kept = build_compressor("most_used", 2, 1)(old, usage)
    assert kept.squeeze(-1).tolist() == [[1., 3.], [4., 7.]]


def test_an_unknown_compression_is_one_line():
    with pytest.raises(ConfigError, match="stack.compression='avg'.*conv, mean_pool") as error:
        build_model(compose_config("model=compressive_transformer", *SMALL,
                                   "stack.compression=avg"), vocab_size=256)
    assert "\n" not in str(error.value)


# --------------------------------------------------------------------------- the recurrence


@pytest.mark.parametrize("compression,overrides", [
    ("mean_pool", ()),
    ("max_pool", ("position=rotary",)),
    ("conv", ()),
    ("conv", ("model.share_blocks=true", "model.norm_placement=post")),
])
def test_the_stack_attends_over_compressed_memory_memory_and_segment(compression, overrides):
    model = compressive_model(f"stack.compression={compression}", *overrides, n_layers=3)
    segs = segments(5)
    with torch.no_grad():
        outputs = [model(seg) for seg in segs]
        torch.testing.assert_close(outputs[-1], reference(model, segs, 4, 3, 2, compression),
                                   atol=1e-5, rtol=1e-5)


def test_the_compressed_memory_changes_the_output():
    model = compressive_model()
    segs = segments(4)
    with torch.no_grad():
        for seg in segs[:3]:
            model(seg)
        memory, compressed = list(model.stack.memory()), list(model.stack.compressed_memory())
        plain = model(segs[3])
        model.stack._memory[False] = memory
        noise = torch.randn_like(compressed[0])  # not a constant: the layer norm removes it
        model.stack._compressed[False] = [compressed[0] + noise, compressed[1]]
        assert not torch.allclose(model(segs[3]), plain, atol=1e-4)
        model.stack._memory[False], model.stack._compressed[False] = memory, compressed
        torch.testing.assert_close(model(segs[3]), plain, rtol=0, atol=0)


def test_without_compressed_memory_the_stack_is_transformer_xl():
    model = compressive_model(cmem_len=0)
    config = compose_config("model=transformer_xl", *SMALL, "model.n_layers=2", "stack.mem_len=4")
    xl = build_model(config, vocab_size=256).eval()
    missing, unexpected = xl.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all(k.startswith("stack.compressors.") for k in unexpected)
    with torch.no_grad():
        for seg in segments(4):
            torch.testing.assert_close(model(seg), xl(seg), rtol=0, atol=0)
    assert lengths(model) == ([4, 4], [0, 0])


def test_causal_within_a_segment():
    models = [compressive_model(), compressive_model()]
    segs = segments(4)
    changed = segs[3].clone()
    changed[:, 2:] = (changed[:, 2:] + 1) % 256
    with torch.no_grad():
        outputs = []
        for model, last in zip(models, (segs[3], changed)):
            for seg in segs[:3]:
                model(seg)
            outputs.append(model(last))
    torch.testing.assert_close(outputs[0][:, :2], outputs[1][:, :2], rtol=0, atol=0)
    assert not torch.allclose(outputs[0][:, 2:], outputs[1][:, 2:])


# --------------------------------------------------------------------------- reconstruction


def test_reconstruction_loss_is_the_papers_formula_and_trains_only_the_compression():
    model = compressive_model("stack.reconstruction_weight=0.5", n_layers=1, cmem_len=4).train()
    seg1, seg2 = segments(2)
    model(seg1)
    assert model.report() == {}  # nothing compressed yet: no loss to report
    old = model.stack.memory()[0]  # (B, 4, D): segment 1's states, all leaving the memory
    block = model.stack.blocks[0]
    h = captured_inputs(model, seg2)
    with torch.no_grad():  # the formula, every projection written out

        def attn(m):
            q, k, v = qkv_by_hand(block, h)[0], *qkv_by_hand(block, m)[1:]
            return (q @ k.transpose(-1, -2) / math.sqrt(D // H)).softmax(-1) @ v  # (B, H, T, Dh)

        conv = model.stack.compressors[0].conv
        new = F.conv1d(old.transpose(1, 2), conv.weight, conv.bias, stride=2).transpose(1, 2)
        expected = (attn(old) - attn(new)).pow(2).mean()
    loss = model.auxiliary_loss()
    torch.testing.assert_close(loss, 0.5 * expected)
    assert model.report()["reconstruction_loss"] == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    for name, p in model.named_parameters():
        if name.startswith("stack.compressors."):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None or not p.grad.any(), name


def test_no_reconstruction_loss_without_parameters_or_in_evaluation():
    pooled = compressive_model("stack.compression=mean_pool").train()
    conv = compressive_model()
    for seg in segments(3):
        pooled(seg)
        assert pooled.auxiliary_loss() is None
        with torch.no_grad():
            conv(seg)
        assert conv.auxiliary_loss() is None
    assert pooled.report() == {} and conv.report() == {}


def test_most_used_keeps_the_old_states_the_segment_attended_most():
    """Usage by hand: the content-only causal attention of segment 2's queries over its keys
    [segment 1; segment 2], averaged over heads and queries; the top 2 of segment 1's 4 states
    (all leaving the memory) are kept, in time order."""
    model = compressive_model("stack.compression=most_used", n_layers=1, cmem_len=4)
    seg1, seg2 = segments(2, batch=3)
    with torch.no_grad():
        model(seg1)
        old = model.stack.memory()[0]  # (B, 4, D)
        h = captured_inputs(model, seg2)
        q, k = qkv_by_hand(model.stack.blocks[0], torch.cat([old, h], dim=1))[:2]
        logits = q[:, :, -T:] @ k.transpose(-1, -2) / math.sqrt(D // H)  # (B, H, T, 2 T)
        later = torch.ones(T, 2 * T, dtype=torch.bool).triu(T + 1)
        usage = logits.masked_fill(later, float("-inf")).softmax(-1).mean(dim=(1, 2))[:, :T]
    chosen = usage.topk(2, dim=1).indices.sort(dim=1).values  # (B, 2)
    expected = torch.stack([old[b, chosen[b]] for b in range(old.shape[0])])
    torch.testing.assert_close(model.stack.compressed_memory()[0], expected, rtol=0, atol=0)
    assert len({tuple(row) for row in chosen.tolist()}) > 1  # the rows chose differently
    assert model.auxiliary_loss() is None


# --------------------------------------------------------------------------- refusals and a run


def test_conv_needs_the_attentions_projections():
    from xformer_bench.stacks.compressive import CompressiveStack

    class Mixer(torch.nn.Module):
        provides = frozenset({"causal", "longer_keys"})

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = Mixer()

    dims = ModelDims(d_model=D, n_heads=H, n_layers=1, d_ff=32, seq_len=T, vocab_size=256)
    with pytest.raises(ConfigError, match="stack.compression=mean_pool") as refused:
        CompressiveStack(dims, Block)
    assert "\n" not in str(refused.value)
    CompressiveStack(dims, Block, compression="mean_pool")  # pooling reads no projections


@pytest.mark.parametrize("key,value", [("cmem_len", -1), ("compression_rate", 0),
                                       ("reconstruction_weight", -1.0)])
def test_bad_lengths_and_rates_are_one_line(key, value):
    with pytest.raises(ConfigError, match=f"stack.{key}") as refused:
        build_model(compose_config("model=compressive_transformer", *SMALL, f"stack.{key}={value}"),
                    vocab_size=256)
    assert "\n" not in str(refused.value)


def test_a_compressive_transformer_run_trains_and_reports_its_loss(tmp_path):
    record = run_tiny(tmp_path, "model=compressive_transformer", "trainer.max_steps=2")
    assert record["status"] == "finished" and record["steps"] == 2
    assert record["choices"]["stack"] == "compressive"
    assert record["eval_protocol"]["windows"] == "streams"
    assert record["model_report"]["reconstruction_loss"] > 0  # step 2 compressed step 1's states
