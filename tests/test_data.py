"""Byte datasets: windows, splits, the enwik8 loader on a generated zip, offline errors."""

from __future__ import annotations

import time
import zipfile

import numpy as np
import pytest
import torch

from xformer_bench.data import enwik8
from xformer_bench.data.byte_windows import EvalWindows, RandomWindows, split_by_fraction
from xformer_bench.data.synthetic import generate
from xformer_bench.errors import ConfigError, MissingDataError
from xformer_bench.registry import DATA
from xformer_bench.targets import IGNORE_INDEX


@pytest.mark.parametrize("n_bytes,seq_len,batch", [(1000, 16, 4), (17, 16, 4), (16, 16, 3), (333, 7, 5)])
def test_eval_windows_predict_every_byte_but_the_first_exactly_once(n_bytes, seq_len, batch):
    data = (np.arange(n_bytes) % 251).astype(np.uint8)
    seen = []
    dataset = EvalWindows(data, seq_len, batch)
    for inputs, targets in (dataset[j] for j in range(len(dataset))):
        assert inputs.shape == targets.shape and inputs.shape[1] == seq_len
        valid = targets != IGNORE_INDEX
        # each valid target is the byte after its input, and is the next byte of the split
        assert torch.equal(targets[valid], torch.from_numpy(((inputs.long() + 1) % 251).numpy())[valid])
        seen.append(targets[valid])
    assert torch.equal(torch.cat(seen), torch.from_numpy(data[1:].astype(np.int64)))


def test_eval_windows_shard_across_ranks_without_overlap():
    data = (np.arange(5000) % 256).astype(np.uint8)
    full = EvalWindows(data, 32, 4)
    shards = [EvalWindows(data, 32, 4, shard=r, n_shards=3) for r in range(3)]
    assert sorted(b for s in shards for b in s.batches) == full.batches


def test_random_windows_depend_only_on_seed_and_step():
    data = np.random.default_rng(0).integers(0, 256, 10_000).astype(np.uint8)
    a, b = RandomWindows(data, 64, 8, seed=3, steps=100), RandomWindows(data, 64, 8, seed=3, steps=100)
    x5, y5 = a[5]
    assert torch.equal(x5, b[5][0]) and torch.equal(x5[:, 1:], y5[:, :-1])
    assert not torch.equal(a[5][0], a[6][0])
    assert not torch.equal(a[5][0], RandomWindows(data, 64, 8, seed=4, steps=100)[5][0])


def test_split_by_fraction_is_contiguous_and_complete():
    data = np.arange(1000, dtype=np.uint16)
    splits = split_by_fraction(data, (0.9, 0.05, 0.05))
    assert [len(s) for s in splits.values()] == [900, 50, 50]
    assert np.array_equal(np.concatenate(list(splits.values())), data)


def test_synthetic_corpus_is_deterministic_and_structured():
    a, b, c = generate(50_000, seed=1), generate(50_000, seed=1), generate(50_000, seed=2)
    assert len(a) == 50_000 and np.array_equal(a, b) and not np.array_equal(a, c)
    counts = np.bincount(a, minlength=256) / len(a)
    entropy = -(counts[counts > 0] * np.log2(counts[counts > 0])).sum()
    assert entropy < 5.0  # far from uniform bytes (8 bits)


def test_text_dataset_memory_maps_a_local_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"hello world " * 1000)
    dm = DATA.build({"name": "text", "path": str(path)}, seed=0, data_dir=str(tmp_path),
                    seq_len=8, batch_size=2)
    assert isinstance(dm.splits["train"], np.memmap)
    assert sum(dm.split_bytes(s) for s in ("train", "val", "test")) == 12_000


def test_text_dataset_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="data.path"):
        DATA.build({"name": "text"}, seed=0, data_dir=str(tmp_path), seq_len=8, batch_size=2)
    with pytest.raises(MissingDataError, match="no such file"):
        DATA.build({"name": "text", "path": str(tmp_path / "nope.txt")}, seed=0,
                   data_dir=str(tmp_path), seq_len=8, batch_size=2)


def _fake_enwik8() -> bytes:
    """10^8 bytes whose value encodes the split they belong to, with a marked boundary."""
    data = np.full(enwik8.TOTAL_BYTES, ord("t"), dtype=np.uint8)
    data[90_000_000:95_000_000] = ord("v")
    data[95_000_000:] = ord("x")
    return data.tobytes()


@pytest.fixture(scope="module")
def enwik8_zip(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    with zipfile.ZipFile(folder / "enwik8.zip", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr("enwik8", _fake_enwik8())
    return folder


def test_enwik8_from_zip_uses_the_standard_90_5_5_split(enwik8_zip):
    dm = DATA.build({"name": "enwik8"}, seed=0, data_dir=str(enwik8_zip), seq_len=64, batch_size=2)
    assert (enwik8_zip / "enwik8").stat().st_size == enwik8.TOTAL_BYTES  # extracted and cached
    sizes = {s: dm.split_bytes(s) for s in ("train", "val", "test")}
    assert sizes == {"train": 90_000_000, "val": 5_000_000, "test": 5_000_000}
    for split, byte in (("train", "t"), ("val", "v"), ("test", "x")):
        part = dm.splits[split]
        assert isinstance(part, np.memmap)
        assert part[0] == part[-1] == ord(byte)


def test_enwik8_rejects_a_truncated_file(tmp_path):
    (tmp_path / "enwik8").write_bytes(b"abc" * 100)
    with pytest.raises(MissingDataError, match="must be 100,000,000 bytes"):
        DATA.build({"name": "enwik8"}, seed=0, data_dir=str(tmp_path), seq_len=8, batch_size=2)


def test_enwik8_offline_and_missing_fails_fast_naming_the_file(tmp_path):
    started = time.perf_counter()
    with pytest.raises(MissingDataError) as error:
        DATA.build({"name": "enwik8"}, seed=0, data_dir=str(tmp_path / "nowhere"), seq_len=8,
                   batch_size=2)
    assert time.perf_counter() - started < 5
    message = str(error.value)
    assert "\n" not in message and "enwik8.zip" in message and str(tmp_path / "nowhere") in message
