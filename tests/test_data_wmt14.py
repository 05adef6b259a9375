"""data=wmt14: aligned local files or HF parquet shards, a cached joint BPE that round-trips
text, translation batches (bos / eos / padding), evaluation over every sentence, one-line
errors, and offline failure in well under two seconds."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from xformer_bench.config import CONF_DIR
from xformer_bench.data import bpe as bpe_module
from xformer_bench.data import parallel_text
from xformer_bench.data.bpe import JointBPE
from xformer_bench.errors import ConfigError, MissingDataError
from xformer_bench.registry import DATA

WORDS = {"the": "die", "house": "Häuser", "is": "ist", "small": "klein", "green": "grün",
         "street": "Straße", "coffee": "Kaffee", "café": "Café", "very": "sehr", "big": "groß",
         "old": "alt", "we": "wir", "see": "sehen", "a": "ein", "naïve": "naïv", "cat": "Katze",
         "eats": "frisst", "fish": "Fisch", "today": "heute", "and": "und"}
PUNCTUATION = [".", "!", "?", ",", " –", ":", ";", "…"]


def _pairs(n: int, seed: int, long: int = 0) -> list[tuple[str, str]]:
    """Word-for-word 'translations' through a fixed dictionary, with punctuation and accents;
    the last ``long`` pairs have 60-80 words."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(60, 80) if i >= n - long else rng.randint(2, 9)
        words = [rng.choice(list(WORDS)) for _ in range(k)]
        mark = rng.choice(PUNCTUATION)
        source = " ".join(words) + mark
        target = " ".join(WORDS[w] for w in words) + mark
        if i % 7 == 0:
            source, target = f"«{source}»", f"„{target}“"
        out.append((source.capitalize(), target.capitalize()))
    return out


def _write_folder(folder: Path, src: str = "src", tgt: str = "tgt", long: int = 0,
                  sizes=(("train", 200), ("valid", 23), ("test", 31))) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for seed, (stem, n) in enumerate(sizes):
        pairs = _pairs(n, seed, long if stem == "train" else 0)
        (folder / f"{stem}.{src}").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (folder / f"{stem}.{tgt}").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
        written[stem] = pairs
    return written


def _build(data_dir: Path, **keys):
    spec = {"name": "wmt14", "vocab_size": 400, "subset": None, "seq_len": 256,
            "batch_size": 8, "eval_batch_size": 5, **keys}
    return DATA.build(spec, seed=0, data_dir=str(data_dir))


@pytest.fixture
def folder(tmp_path):
    written = _write_folder(tmp_path / "corpus")
    return tmp_path / "corpus", written


def test_builds_from_a_folder_and_declares_the_translate_contract(tmp_path, folder):
    path, written = folder
    dm = _build(tmp_path / "data", path=str(path))
    assert (dm.task, dm.unit) == ("translate", "tokens")
    assert (dm.pad_id, dm.bos_id, dm.eos_id) == (0, 1, 2) and 200 < dm.vocab_size <= 400
    assert (dm.src_lang, dm.tgt_lang) == ("src", "tgt")
    assert [dm.split_size(s) for s in ("train", "val", "test")] == [200, 23, 31]
    assert dm.dropped_train_pairs == 0 and dm.truncated_eval == {"val": 0, "test": 0}
    assert dm.references("test") == [t for _, t in written["test"]]
    assert dm.references("val") == (path / "valid.tgt").read_text(encoding="utf-8").splitlines()
    cached = sorted(p.name.split("-")[0] for p in (tmp_path / "data" / "wmt14").iterdir())
    assert cached == ["bpe", "tokens"]


def test_a_second_build_reuses_the_tokenizer_and_the_token_cache(tmp_path, folder, monkeypatch):
    path, _ = folder
    first = _build(tmp_path / "data", path=str(path))

    def refuse(*args, **kwargs):
        raise AssertionError("should have come from the cache")

    monkeypatch.setattr(bpe_module, "train", refuse)
    monkeypatch.setattr(JointBPE, "encode", refuse)
    monkeypatch.setattr(parallel_text.ParallelFolder, "read", refuse)
    second = _build(tmp_path / "data", path=str(path))
    assert second.vocab_size == first.vocab_size
    assert second.references("test") == first.references("test")
    indices = np.arange(8)
    for a, b in zip(first.splits["train"].batch(indices), second.splits["train"].batch(indices)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("text", [
    "Die Straße ist grün.", "  two  leading, «three»   inside  ", "naïve café – “quoted”!?",
    "unseen: 日本語 😀 \t tab", "", "literal <s> and </s> and <pad>"])
def test_decode_inverts_encode_exactly(tmp_path, folder, text):
    dm = _build(tmp_path / "data", path=str(folder[0]))
    ids = dm.encode(text)
    assert 3 not in ids  # <unk>: byte-level BPE leaves nothing out of vocabulary
    assert dm.decode(ids) == text
    framed = [dm.bos_id, *ids, dm.eos_id, *dm.encode("after eos"), dm.pad_id, dm.pad_id]
    assert dm.decode(torch.tensor(framed)) == text  # stops at eos, drops bos and pad


def _check_rows(source: torch.Tensor, target: torch.Tensor, dm) -> None:
    assert source.dtype == target.dtype == torch.int64
    assert (target[:, 0] == dm.bos_id).all()
    for side in (source, target):
        real = side != dm.pad_id
        lengths = real.sum(dim=1)
        assert lengths.max() == side.shape[1]  # padded to the batch's longest, no further
        for row, n in zip(side, lengths):
            assert (row[:n] != dm.pad_id).all() and (row[n:] == dm.pad_id).all()
            assert row[n - 1] == dm.eos_id and (row[:n - 1] != dm.eos_id).all()
            assert (row[1:n] != dm.bos_id).all()


def test_training_batches_work_without_a_trainer(tmp_path, folder):
    path, written = folder
    dm = _build(tmp_path / "data", path=str(path))
    loader = dm.train_dataloader()
    batches = [b for _, b in zip(range(3), loader)]
    sources = {s for s, _ in written["train"]}
    pairs = dict(written["train"])
    for source, target in batches:
        assert source.shape[0] == target.shape[0] == 8
        _check_rows(source, target, dm)
        for s, t in zip(source, target):
            assert dm.decode(s) in sources and pairs[dm.decode(s)] == dm.decode(t)
    again = next(iter(dm.train_dataloader()))
    assert torch.equal(again[0], batches[0][0])  # seeded: the same first step


@pytest.mark.parametrize("split,stem", [("val", "valid"), ("test", "test")])
def test_evaluation_covers_every_pair_once_with_its_index(tmp_path, folder, split, stem):
    path, written = folder
    dm = _build(tmp_path / "data", path=str(path))
    loader = dm.val_dataloader() if split == "val" else dm.test_dataloader()
    seen = []
    references = dm.references(split)
    for source, target, index in loader:
        _check_rows(source, target, dm)
        for s, t, i in zip(source, target, index.tolist()):
            assert dm.decode(s) == written[stem][i][0] and dm.decode(t) == references[i]
        seen.extend(index.tolist())
    assert sorted(seen) == seen == list(range(len(written[stem])))


def test_suffixes_name_the_files_and_the_languages(tmp_path):
    written = _write_folder(tmp_path / "corpus", src="en", tgt="de")
    dm = _build(tmp_path / "data", path=str(tmp_path / "corpus"), src_suffix="en", tgt_suffix="de")
    assert (dm.src_lang, dm.tgt_lang) == ("en", "de")
    assert dm.references("test") == [t for _, t in written["test"]]
    with pytest.raises(MissingDataError, match=r"missing train\.src.*data\.src_suffix") as error:
        _build(tmp_path / "data", path=str(tmp_path / "corpus"))
    assert "\n" not in str(error.value)


def test_misaligned_files_are_one_line_naming_both_and_their_counts(tmp_path, folder):
    path, _ = folder
    lines = (path / "train.tgt").read_text(encoding="utf-8").splitlines()
    (path / "train.tgt").write_text("\n".join(lines[:-3]) + "\n", encoding="utf-8")
    with pytest.raises(MissingDataError) as error:
        _build(tmp_path / "data", path=str(path))
    message = str(error.value)
    assert "\n" not in message
    assert "train.src has 200 lines" in message and "train.tgt has 197" in message


def _write_parquet(folder: Path, pairs_per_shard: dict[str, list[list[tuple[str, str]]]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    for split, shards in pairs_per_shard.items():
        for k, pairs in enumerate(shards):
            column = pa.array([{"de": t, "en": s} for s, t in pairs],
                              type=pa.struct([("de", pa.string()), ("en", pa.string())]))
            pq.write_table(pa.table({"translation": column}),
                           folder / f"{split}-{k:05d}-of-{len(shards):05d}.parquet")


def test_hf_parquet_shards_work_offline_in_either_direction(tmp_path):
    train = _pairs(150, 0)
    val, test = _pairs(12, 1), _pairs(17, 2)
    _write_parquet(tmp_path / "wmt14" / "de-en",
                   {"train": [train[:90], train[90:]], "validation": [val], "test": [test]})
    dm = _build(tmp_path, subset=120)
    assert (dm.src_lang, dm.tgt_lang) == ("en", "de")
    assert dm.split_size("train") == 120  # the first 120 pairs, across both shards
    assert dm.references("test") == [t for _, t in test]
    source, target, index = next(iter(dm.test_dataloader()))
    assert [dm.decode(s) for s in source] == [s for s, _ in test[:len(source)]]

    back = _build(tmp_path, subset=120, direction="de-en")
    assert (back.src_lang, back.tgt_lang) == ("de", "en")
    assert back.references("val") == [s for s, _ in val]
    assert len(list((tmp_path / "wmt14").glob("bpe-*.json"))) == 1  # one joint vocabulary


def test_offline_with_nothing_fails_fast_in_one_line_naming_what_to_place(tmp_path):
    started = time.perf_counter()
    with pytest.raises(MissingDataError) as error:
        _build(tmp_path / "nowhere")
    assert time.perf_counter() - started < 2
    message = str(error.value)
    assert "\n" not in message and "data.path=DIR" in message and "train.src" in message
    assert str(tmp_path / "nowhere" / "wmt14" / "de-en") in message and "offline" in message


def test_too_long_training_pairs_are_dropped_and_evaluation_keeps_all(tmp_path):
    _write_folder(tmp_path / "corpus", long=6,
                  sizes=(("train", 200), ("valid", 10), ("test", 10)))
    long_eval = _pairs(3, 5, long=3)
    with open(tmp_path / "corpus" / "test.src", "a", encoding="utf-8") as s, \
            open(tmp_path / "corpus" / "test.tgt", "a", encoding="utf-8") as t:
        for a, b in long_eval:
            s.write(a + "\n")
            t.write(b + "\n")
    dm = _build(tmp_path / "data", path=str(tmp_path / "corpus"), max_source_len=60,
                max_target_len=60, max_eval_len=64, seq_len=128)
    assert dm.dropped_train_pairs == 6 and dm.split_size("train") == 194
    assert dm.split_size("test") == 13 and dm.truncated_eval["test"] == 3
    for source, target in (next(iter(dm.train_dataloader())),):
        assert source.shape[1] <= 61 and target.shape[1] <= 62
    batches = list(dm.test_dataloader())
    assert sum(len(b[2]) for b in batches) == 13
    assert max(b[0].shape[1] for b in batches) == 65  # truncated to max_eval_len, then eos
    assert dm.references("test")[-3:] == [b for _, b in long_eval]  # references untouched


def test_lengths_beyond_the_model_are_refused_before_any_work(tmp_path, folder):
    with pytest.raises(ConfigError, match="data.seq_len=64"):
        _build(tmp_path / "data", path=str(folder[0]), seq_len=64)


def test_the_yaml_builds_and_documents_its_defaults(tmp_path, folder):
    spec = yaml.safe_load((CONF_DIR / "data" / "wmt14.yaml").read_text())
    assert spec["vocab_size"] == 8000 and spec["subset"] == 200000 and spec["direction"] == "en-de"
    spec.update(path=str(folder[0]), vocab_size=400)
    dm = DATA.build(spec, seed=0, data_dir=str(tmp_path / "data"))
    assert dm.split_size("train") == 200 and dm.batch_size == spec["batch_size"]


def test_a_tiny_translation_run_trains_and_scores_every_sentence(tmp_path, folder):
    from conftest import compose_config
    from xformer_bench.config import choice_groups
    from xformer_bench.run import execute

    overrides = ["data=wmt14", f"data.path={folder[0]}", f"paths.data_dir={tmp_path / 'data'}",
                 "data.vocab_size=400", "data.seq_len=64", "data.max_source_len=40",
                 "data.max_target_len=40", "data.batch_size=4", "data.eval_batch_size=16",
                 "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.d_ff=64",
                 "trainer.max_steps=4", "optim.warmup_steps=2", "trainer.progress_bar=false",
                 "logger=none", "eval.max_extra_len=5", f"paths.results_dir={tmp_path / 'results'}"]
    config = compose_config(*overrides)
    choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
    record = execute(config, choices, overrides, tmp_path / "run")
    assert record["status"] == "finished" and "test/bleu" in record["test"]
    assert record["bleu_signature"].startswith("nrefs:1")


def test_a_save_to_disk_folder_is_read_with_datasets(tmp_path):
    import datasets

    pairs = {"train": _pairs(60, 0), "validation": _pairs(7, 1), "test": _pairs(9, 2)}
    datasets.DatasetDict({
        split: datasets.Dataset.from_dict({"translation": [{"de": t, "en": s} for s, t in p]})
        for split, p in pairs.items()}).save_to_disk(str(tmp_path / "wmt14" / "de-en"))
    dm = _build(tmp_path, subset=50, direction="de-en")
    assert dm.split_size("train") == 50 and (dm.src_lang, dm.tgt_lang) == ("de", "en")
    assert dm.references("test") == [s for s, _ in pairs["test"]]


def test_an_unreachable_hub_online_is_one_line_too(tmp_path, monkeypatch):
    from xformer_bench.data import wmt14

    def unreachable(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(wmt14, "offline", lambda: False)
    monkeypatch.setattr(wmt14.socket, "create_connection", unreachable)
    with pytest.raises(MissingDataError, match=r"download failed \(OSError: network") as error:
        _build(tmp_path)
    assert "\n" not in str(error.value) and "data.path=DIR" in str(error.value)


def test_parquet_without_a_translation_struct_is_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "wmt14" / "de-en"
    folder.mkdir(parents=True)
    for split in ("train", "validation", "test"):
        pq.write_table(pa.table({"de": ["Hallo"], "en": ["Hello"]}),
                       folder / f"{split}-00000-of-00001.parquet")
    with pytest.raises(MissingDataError, match=r"'translation' column of \{en, de\}") as error:
        _build(tmp_path)
    assert "\n" not in str(error.value)
    (folder / "test-00000-of-00001.parquet").unlink()
    with pytest.raises(MissingDataError, match="none for test"):
        _build(tmp_path)
