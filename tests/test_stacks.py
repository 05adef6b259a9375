"""Every stack, generically: it trains through the real path, stays causal, and
``model.checkpointing`` recomputes exactly (each block with its own layer index: per-layer
position tables make a wrong index visible)."""

from __future__ import annotations

import pytest
import torch

from conftest import SMALL_DIMS, changed_future, compose_config, run_tiny, seeded_model, seeded_tokens
from xformer_bench.config import CONF_DIR
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model

STACKS = sorted(p.stem for p in (CONF_DIR / "stack").glob("*.yaml"))


@pytest.mark.parametrize("stack", STACKS)
def test_checkpointing_recomputes_the_same_loss_and_gradients(stack):
    results = []
    for checkpointing in ("false", "true"):
        model = seeded_model(f"stack={stack}", *SMALL_DIMS, "model.n_layers=3",
                             "position=relative", f"model.checkpointing={checkpointing}").train()
        log_probs = model(seeded_tokens())
        auxiliary = model.auxiliary_loss()
        loss = -log_probs.mean() + (0 if auxiliary is None else auxiliary)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b)
    for a, b in zip(grads_a, grads_b):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("train", [True, False])
def test_no_stack_reads_the_future(stack, train):
    model = seeded_model(f"stack={stack}", *SMALL_DIMS).train(train)
    changed_future(model, seeded_tokens(0), 9, seeded_tokens(5))


REPORTS = {  # what each stack's report() must say in the record after two training steps
    "universal": lambda r: 1.0 <= r["ponder_steps"] <= 2.0,  # max_depth: 2 x 1 layer
    "conditional": lambda r: 0.0 <= r["executed_fraction"] <= 1.0 and 0.0 < r["mean_gate"] < 1.0,
}


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_trains_two_steps_through_the_real_path(stack, tmp_path):
    record = run_tiny(tmp_path, f"stack={stack}", "trainer.max_steps=2")
    assert record["status"] == "finished" and record["steps"] == 2
    assert record["choices"]["stack"] == stack
    assert torch.isfinite(torch.tensor(record["final"]["val/loss"]))
    assert REPORTS.get(stack, lambda r: True)(record["model_report"])


@pytest.mark.parametrize("stack, override, key", [
    ("conditional", "stack.target_fraction=1.5", "stack.target_fraction"),
    ("conditional", "stack.budget_weight=-1", "stack.budget_weight"),
    ("universal", "stack.threshold=1.5", "stack.threshold"),
    ("universal", "stack.max_depth=0", "stack.max_depth"),
    ("universal", "stack.ponder_cost=-1", "stack.ponder_cost"),
    ("reversible", "stack.ffn_chunks=0", "stack.ffn_chunks"),
    ("funnel", "stack.layers=[1,0,1]", "stack.layers"),
])
def test_bad_values_are_refused_in_one_line(stack, override, key):
    with pytest.raises(ConfigError) as refused:
        seeded_model(f"stack={stack}", *SMALL_DIMS, override)
    assert str(refused.value).startswith(key) and "\n" not in str(refused.value)


@pytest.mark.parametrize("stack", ["recurrent", "compressive"])
@pytest.mark.parametrize("attention", ["lsh", "fnet"])
def test_memory_stacks_refuse_mixers_without_longer_keys_in_one_line(stack, attention):
    """Declared, not special-cased: the stack's need of longer keys is the message (for causal
    LSH the only refusal; FNet is refused first for being bidirectional)."""
    from xformer_bench.models.capabilities import Part, unmet
    from xformer_bench.core.dims import ModelDims
    from xformer_bench.models.token_mixer import build_token_mixer
    from xformer_bench.registry import STACK

    config = compose_config(f"stack={stack}", f"attention={attention}", *SMALL_DIMS)
    with pytest.raises(ConfigError) as refused:
        build_model(config, vocab_size=256)
    assert "\n" not in str(refused.value)
    dims = ModelDims(d_model=32, n_heads=2, n_layers=2, d_ff=64, seq_len=16, vocab_size=256)
    needs = unmet([Part("attention", f"attention={attention}",
                        build_token_mixer(config["attention"], dims)),
                   Part("stack", f"stack={stack}", STACK.get(stack))])
    assert needs == [f"stack={stack} needs more keys than queries (memory, cross-attention), "
                     f"which attention={attention} does not provide; choose another stack or "
                     "attention"]
    if attention == "lsh":
        assert str(refused.value) == needs[0]
