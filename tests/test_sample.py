"""Generation: a cached decode equals the uncached one; the sampling filters on hand
cases; models that cannot cache still sample; ``xbench-sample`` on a trained run."""

from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import SMALL_DIMS, run_tiny, seeded_model
from xformer_bench.core.decode_cache import DecodeCache
from xformer_bench.models.cached_decoding import cache_blocker
from xformer_bench.registry import POSITION
from xformer_bench.sample import Decoder, generate, main, sampling_probs

WINDOW = 16  # SMALL_DIMS' data.seq_len


def model_of(*overrides: str, seed: int = 0):
    return seeded_model(*SMALL_DIMS, *overrides, seed=seed, vocab_size=256).eval()


def prompt(length: int = 4, batch: int = 2) -> torch.Tensor:  # (B, P)
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(1))


CACHEABLE = [(), ("position=rotary",), ("position=alibi",), ("position=t5",),
             ("position=learned",), ("position=xl_relative",), ("attention=multi_query",),
             ("attention=multi_query", "position=rotary"), ("model.share_blocks=true",),
             ("attention=local",)]


@pytest.mark.parametrize("overrides", CACHEABLE, ids=lambda o: " ".join(o) or "full")
def test_each_cached_step_scores_as_the_full_recompute(overrides):
    model = model_of(*overrides)
    assert cache_blocker(model) is None
    tokens = generate(model, prompt(), 10, WINDOW, generator=torch.Generator().manual_seed(0))
    decoder = Decoder(model, WINDOW)
    with torch.no_grad():
        for n in range(4, tokens.shape[1]):  # the step that chose token n saw tokens[:, :n]
            cached = decoder.next_logprobs(tokens[:, :n])  # (B, V)
            torch.testing.assert_close(cached, model(tokens[:, :n])[:, -1], atol=1e-5, rtol=0)
    assert decoder.cache is not None and decoder.cache.length == tokens.shape[1] - 1
    assert len(decoder.cache.slots) == 2  # one slot per application, shared block or not


def test_multi_query_caches_one_key_head():
    decoder = Decoder(model_of("attention=multi_query"), WINDOW)
    decoder.next_logprobs(prompt())
    assert decoder.cache.slots[0]["keys"].shape == (2, 1, 4, 16)  # (B, H_kv, S, Dh)


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"top_k": 1}])
def test_greedy_generation_is_the_same_with_and_without_the_cache(sampling):
    model = model_of("position=rotary")
    made = [generate(model, prompt(), 12, WINDOW, use_cache=use_cache,
                     generator=torch.Generator().manual_seed(0), **sampling)
            for use_cache in (True, False)]
    assert made[0].shape == (2, 16) and torch.equal(made[0], made[1])


def test_the_cache_rejects_a_model_it_was_not_filled_by():
    cache = DecodeCache()
    model_of().decode(prompt(), cache)  # two layers: two slots of 4 positions
    k, v = cache.slots[0]["keys"][:, :, :1], cache.slots[0]["values"][:, :, :1]  # (B, H_kv, 1, Dh)
    cache.begin_step(1)
    cache.extend(k, v)
    cache.extend(k, v)
    with pytest.raises(RuntimeError, match="no slot for mixer application 2"):
        cache.extend(k, v)


def test_the_cache_rejects_keys_of_another_length():
    cache = DecodeCache()
    cache.begin_step(3)
    with pytest.raises(RuntimeError, match="cached 2 positions, expected 3"):
        cache.extend(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4))


def test_temperature_scales_the_logits():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    torch.testing.assert_close(sampling_probs(logits), torch.tensor([[0.5, 0.25, 0.25]]))
    # T = 0.5 squares the probabilities: 0.25, 0.0625, 0.0625 of 0.375
    torch.testing.assert_close(sampling_probs(logits, temperature=0.5),
                               torch.tensor([[2 / 3, 1 / 6, 1 / 6]]))
    assert torch.equal(sampling_probs(logits, temperature=0), torch.tensor([[1.0, 0.0, 0.0]]))


def test_top_k_keeps_exactly_k_candidates():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3]])
    torch.testing.assert_close(sampling_probs(probs.log(), top_k=2),
                               torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))
    torch.testing.assert_close(sampling_probs(probs.log(), top_k=1),
                               torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    assert torch.equal(sampling_probs(probs.log(), top_k=9), sampling_probs(probs.log()))


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.05, 0.05, 0.1, 0.8]])
    # row 0 sorted 0.4, 0.3, 0.2, 0.1: p = 0.6 needs 0.4 + 0.3; p = 0.7 is reached by the same two
    torch.testing.assert_close(sampling_probs(probs.log(), top_p=0.6),
                               torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7], [0.0, 0.0, 0.0, 1.0]]))
    torch.testing.assert_close(sampling_probs(probs.log(), top_p=0.7)[0],
                               torch.tensor([0.0, 4 / 7, 0.0, 3 / 7]))
    # row 1: 0.8 < 0.85, so 0.1 joins; the two 0.05s stay out
    torch.testing.assert_close(sampling_probs(probs.log(), top_p=0.85)[1],
                               torch.tensor([0.0, 0.0, 1 / 9, 8 / 9]))
    torch.testing.assert_close(sampling_probs(probs.log(), top_p=1.0), probs)
    # top-k first, then top-p of what is left: 4/7 < 0.6, so both stay
    torch.testing.assert_close(sampling_probs(probs[:1].log(), top_k=2, top_p=0.6),
                               torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))


def test_bad_sampling_settings_are_refused():
    with pytest.raises(ValueError, match="top_p"):
        sampling_probs(torch.zeros(1, 3), top_p=0)


@pytest.mark.parametrize("attention", ["lsh", "mixer", "axial"])
def test_a_model_without_cacheable_keys_samples_uncached(attention):
    model = model_of(f"attention={attention}")
    decoder = Decoder(model, WINDOW)
    assert decoder.cache is None and decoder.blocker
    made = [generate(model, prompt(), 6, WINDOW, use_cache=use_cache,
                     generator=torch.Generator().manual_seed(0)) for use_cache in (True, False)]
    assert made[0].shape == (2, 10) and torch.equal(made[0], made[1])


def test_other_stacks_decode_uncached():
    assert "stack=standard" in cache_blocker(model_of("stack=recurrent"))
    assert "ResidualAttention" in cache_blocker(model_of("model.residual_attention=true"))


def test_a_bounded_position_scheme_slides_the_window_past_seq_len():
    model = model_of("position=learned")  # 16 rows
    made = [generate(model, prompt(), 30, WINDOW, use_cache=use_cache, temperature=0)
            for use_cache in (True, False)]
    assert made[0].shape == (2, 34) and torch.equal(made[0], made[1])


def test_an_unbounded_scheme_keeps_caching_past_seq_len():
    model = model_of("position=rotary")
    decoder = Decoder(model, WINDOW)
    tokens = generate(model, prompt(), 30, WINDOW, decoder=decoder,
                      generator=torch.Generator().manual_seed(0))
    assert decoder.cache.length == 33 and tokens.shape == (2, 34)


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "axial", "factorized"])
def test_embedding_from_an_offset_matches_the_whole_sequence(name, tiny_dims):
    torch.manual_seed(0)
    position = POSITION.build({"name": name}, dims=tiny_dims)
    x = torch.randn(1, 12, tiny_dims.d_model)
    assert torch.equal(position.embed(x[:, 5:9], start=5), position.embed(x)[:, 5:9])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run that kept checkpoints, and the path of its record."""
    tmp_path = tmp_path_factory.mktemp("sample")
    record = run_tiny(tmp_path, "trainer.checkpoint=true", "trainer.max_steps=4")
    return tmp_path, tmp_path / "results" / "default" / f"{record['run_id']}.json"


def test_the_cli_prints_the_prompt_and_the_sampled_bytes(trained, capsys):
    tmp_path, record = trained
    assert main([str(record), "--prompt", "ab", "--length", "20", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ab") and len(out.rstrip("\n")) >= 2 + 20 // 4  # UTF-8: <= 4 bytes a char
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert main([str(checkpoint), "--prompt", "ab", "--length", "20", "--seed", "1"]) == 0
    assert capsys.readouterr().out == out  # seeded: the same bytes from the checkpoint's path
    args = ["--prompt", "ab", "--length", "20", "--temperature", "0"]
    main([str(record), *args])
    main([str(record), *args, "--no-cache"])
    greedy, uncached = capsys.readouterr().out.split("\n")[:2]
    assert greedy == uncached


def test_a_run_without_checkpoint_is_one_error_line(trained, tmp_path, capsys):
    record = json.loads(trained[1].read_text())
    record["run_dir"] = str(tmp_path / "elsewhere")
    record["weights_path"] = None  # nor final weights
    (tmp_path / "r.json").write_text(json.dumps(record))
    assert main([str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    assert "trainer.keep_weights=true skip_completed=false" in err
    assert main([str(tmp_path / "missing.json")]) == 2


def test_benchmark_prints_tokens_per_second_with_and_without_cache(trained, capsys):
    assert main([str(trained[1]), "--benchmark", "--length", "8"]) == 0
    out = capsys.readouterr().out.strip()
    assert re.fullmatch(r"decode 8 tokens: ([\d.]+) tokens/s with cache, ([\d.]+) tokens/s "
                        r"without \(speedup [\d.]+x\)", out), out
