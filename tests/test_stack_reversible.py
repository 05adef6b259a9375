"""stack=reversible: RevNet coupling (Gomez et al. 2017) as in the Reformer (Kitaev et al. 2020,
section 3), activations recomputed in the backward pass; ``ffn_chunks`` chunks the feed-forward."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from conftest import compose_config
from xformer_bench.bench.peak_memory import peak_bytes
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.core.context import ForwardContext
from xformer_bench.stacks.reversible import ReversibleStack, branch

V = 64
SIZES = ("model.d_model=32", "model.n_heads=2", "model.n_layers=3", "model.d_ff=64",
         "data.seq_len=16")


def _model(*overrides: str, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(compose_config(*SIZES, *overrides), V)


def _branch(block, sublayer: str, x, ctx):
    """A block's residual branch written out from its pieces (Block._residual minus the add)."""
    norm = block.norms[sublayer]
    h = norm["output"](getattr(block, sublayer)(norm["input"](x), ctx))
    return block.gates[sublayer](block.dropout(h))


def plain_coupling(model, tokens, chunks: int = 1):
    """The reversible network from its equations with ordinary autograd (every activation kept):
    (X1, X2) = (x, x); Y1 = X1 + F(X2); Y2 = X2 + G(Y1) with G on ``chunks`` pieces of T;
    output head on (Y1 + Y2) / 2.  Returns (log-probs, auxiliary loss or None)."""
    stack = model.stack
    ctx = ForwardContext(model.position, causal=True)
    x = model.dropout(model.position.embed(model.embedding(tokens)))
    x1 = x2 = x
    aux = []
    for i in range(stack.n_layers):
        ctx.layer = 0 if stack.share_blocks else i
        block = stack.blocks[ctx.layer]
        ctx.aux_losses = []
        x1 = x1 + _branch(block, "attention", x2, ctx)
        aux += [torch.stack(ctx.aux_losses).sum()] if ctx.aux_losses else []
        ctx.aux_losses = []
        pieces = [_branch(block, "feedforward", piece, ctx) for piece in x1.chunk(chunks, dim=1)]
        aux += [torch.stack(ctx.aux_losses).sum() / len(pieces)] if ctx.aux_losses else []
        x2 = x2 + torch.cat(pieces, dim=1)
    log_probs = model.head(model.final_norm((x1 + x2) / 2))
    return log_probs, (torch.stack(aux).sum() if aux else None)


def _loss(log_probs, aux, tokens):
    loss = F.nll_loss(log_probs.flatten(0, 1), tokens.flatten())
    return loss if aux is None else loss + aux


def _state(model):
    """Buffers and counters that a training forward may update."""
    return ({k: v.clone() for k, v in model.state_dict().items() if "running" in k or "ema" in k
             or "centroids" in k or "steps" in k or "features" in k},
            [m._steps for m in model.modules() if hasattr(m, "_steps")])


@pytest.mark.parametrize("overrides", [
    ("model.dropout=0.1",),
    ("model.dropout=0.1", "stack.ffn_chunks=3"),
    ("model.share_blocks=true", "model.dropout=0.1"),
    ("model.norm_placement=sandwich", "norm=rezero_layernorm"),
    ("norm=fixup",),
    ("position=t5", "position.shared_across_layers=false"),
    ("ffn=moe", "stack.ffn_chunks=2"),  # auxiliary loss (load balancing) per chunk
    ("attention=adaptive_span",),  # auxiliary loss (span penalty) from the attention
    ("attention=lsh", "attention.chunk_size=4"),  # fresh random rotations every forward
    ("attention=routing", "attention.window=8", "attention.local_window=4"),  # EMA centroids
    ("attention=performer", "attention.redraw_interval=1"),  # redraw counter
    ("norm=powernorm",),  # running statistic
], ids=lambda o: ",".join(o))
def test_gradients_equal_the_plain_coupling(overrides):
    """Same parameters, same RNG: the reversible stack's loss and every parameter's gradient
    equal ordinary autograd through the coupling's equations (float64, 1e-5), and the
    recompute leaves running statistics and counters as one forward left them (the RNG too)."""
    model = _model("stack=reversible", *overrides).train()
    if "norm=powernorm" not in overrides:  # its float32 statistic cannot update a float64 buffer
        model.double()
    reference = copy.deepcopy(model)
    chunks = model.stack.ffn_chunks
    tokens = torch.randint(0, V, (2, 16))

    torch.manual_seed(1)
    loss = _loss(model(tokens), model.auxiliary_loss(), tokens)
    after_forward = torch.get_rng_state()
    loss.backward()
    assert torch.equal(torch.get_rng_state(), after_forward)  # the recompute forked the RNG
    torch.manual_seed(1)
    expected = _loss(*plain_coupling(reference, tokens, chunks), tokens)
    expected.backward()

    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=0)
    if model.auxiliary_loss() is not None or "moe" in overrides[0]:
        assert model.auxiliary_loss() is not None
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=0, msg=name)
    (buffers, counters), (expected_buffers, expected_counters) = _state(model), _state(reference)
    assert counters == expected_counters
    for name, value in buffers.items():
        torch.testing.assert_close(value, expected_buffers[name], atol=1e-9, rtol=0, msg=name)


def test_auxiliary_losses_train_the_router():
    """The load-balancing loss alone reaches the router through the Function's extra outputs."""
    model = _model("stack=reversible", "ffn=moe").train()
    model(torch.randint(0, V, (2, 16)))
    aux = model.auxiliary_loss()
    assert aux is not None and aux.requires_grad
    aux.backward()
    router = model.stack.blocks[0].feedforward.router.weight.grad
    assert router is not None and router.abs().sum() > 0


def test_the_recompute_runs_under_the_forwards_autocast():
    model = _model("stack=reversible", "stack.ffn_chunks=1").train()
    dtypes = []
    model.stack.blocks[0].feedforward.up.register_forward_hook(
        lambda module, args, out: dtypes.append(out.dtype))
    tokens = torch.randint(0, V, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        log_probs = model(tokens)
    F.nll_loss(log_probs.float().flatten(0, 1), tokens.flatten()).backward()  # outside autocast
    assert dtypes == [torch.bfloat16] * 2  # the forward and the backward's recompute
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_the_context_is_freed_after_backward_without_the_garbage_collector():
    """The Function keeps a context of its own: the caller's, which holds the Function's
    auxiliary-loss outputs, must not be kept alive by it (a cycle through the autograd graph)."""
    import gc
    import weakref

    model = _model("stack=reversible", "ffn=moe").train()
    ctx = ForwardContext(model.position)
    alive = weakref.ref(ctx)
    gc.disable()
    try:
        out = model.stack(torch.randn(2, 16, 32, requires_grad=True), ctx)
        (out.mean() + ctx.auxiliary_loss()).backward()
        assert len(ctx.aux_losses) == 3 * 1  # one per feed-forward application
        del out, ctx
        assert alive() is None
    finally:
        gc.enable()


def test_the_branch_helper_is_the_blocks_residual_minus_the_add():
    for placement in ("pre", "sandwich"):
        model = _model("stack=reversible", f"model.norm_placement={placement}").eval()
        block, ctx = model.stack.blocks[1], ForwardContext(model.position)
        ctx.layer = 1
        x = torch.randn(2, 16, 32)
        for sublayer in ("attention", "feedforward"):
            torch.testing.assert_close(block._residual(sublayer, x, ctx),
                                       x + branch(block, sublayer, x, ctx))


def test_chunking_the_feed_forward_and_the_no_grad_path_give_the_same_output():
    tokens = torch.randint(0, V, (2, 16))
    outputs = []
    for chunks in (1, 3, 16):
        model = _model("stack=reversible", f"stack.ffn_chunks={chunks}").eval()
        outputs.append(model(tokens))  # grad enabled: through the autograd Function
        with torch.no_grad():
            torch.testing.assert_close(model(tokens), outputs[-1])  # the plain loop
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0])


@pytest.mark.parametrize("chunks", [1, 4])
def test_reversible_stack_is_causal(chunks):
    model = _model("stack=reversible", f"stack.ffn_chunks={chunks}").eval()
    tokens = torch.randint(0, V, (2, 16))
    changed = tokens.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % V
    torch.testing.assert_close(model(tokens)[:, :9], model(changed)[:, :9])
    assert not torch.allclose(model(tokens)[:, 9:], model(changed)[:, 9:])


def test_activation_memory_is_flat_in_depth():
    """Peak bytes of forward + backward at 2 and 8 layers (CPU allocation tracker): the
    standard stack stores every layer's activations, the reversible one only the last."""
    tokens = torch.randint(0, V, (4, 64))

    def peak(stack: str, n_layers: int) -> int:
        model = _model(f"stack={stack}", f"model.n_layers={n_layers}", "data.seq_len=64").train()

        def step():
            F.nll_loss(model(tokens).flatten(0, 1), tokens.flatten()).backward()

        return peak_bytes(step, torch.device("cpu"))

    standard = {n: peak("standard", n) for n in (2, 8)}
    reversible = {n: peak("reversible", n) for n in (2, 8)}
    print(f"peak bytes: standard {standard}, reversible {reversible}")
    assert standard[8] / standard[2] > 2.5
    assert reversible[8] / reversible[2] < 1.5
    assert reversible[8] < 0.5 * standard[8]


@pytest.mark.parametrize("override, message", [
    ("model.norm_placement=post", "stack=reversible needs blocks whose residual is x \\+ branch.*"
                                  "which model.norm_placement=post does not provide"),
    ("model.residual=gru_gate", "stack=reversible needs blocks whose residual.*which "
                                "model.residual=gru_gate does not provide"),
    ("model.residual_attention=true", "model.residual_attention=true needs blocks applied one "
                                      "after another.*which stack=reversible does not provide"),
])
def test_structures_that_cannot_be_inverted_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        _model("stack=reversible", override)


def test_shared_blocks_apply_one_block_at_every_depth():
    model = _model("stack=reversible", "model.share_blocks=true")
    assert isinstance(model.stack, ReversibleStack) and len(model.stack.blocks) == 1
    layers = []
    attention = model.stack.blocks[0].attention
    attention.register_forward_pre_hook(lambda module, args: layers.append(args[1].layer))
    model(torch.randint(0, V, (1, 16))).sum().backward()
    assert layers == [0] * 3 * 2  # 3 in the forward, 3 again in the backward's recompute
