"""CIFAR-10 on a generated tarball in the official format: decoding and channel order, the
cache, the splits, pixel-LM and classification batches, the safe unpickler, offline errors."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import time

import numpy as np
import pytest
import torch

from xformer_bench.data import cifar10, safe_pickle
from xformer_bench.data.cifar10_classify import to_gray
from xformer_bench.data.pixels import BOS_ID
from xformer_bench.errors import ConfigError, MissingDataError
from xformer_bench.registry import DATA

PER_BATCH = 4  # 5 training batches: 20 training images; 4 test images


def _images(n: int, start: int) -> np.ndarray:
    """(n, 32, 32, 3) uint8 whose every pixel encodes image, row, column and channel."""
    i, row, col, ch = np.meshgrid(np.arange(start, start + n), np.arange(32), np.arange(32),
                                  np.arange(3), indexing="ij")
    return ((i * 31 + row * 7 + col * 3 + ch * 85) % 256).astype(np.uint8)


def _rows(images: np.ndarray) -> np.ndarray:
    """The official row format: 1024 red, 1024 green, 1024 blue bytes per image."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2)).reshape(len(images), 3072)


def _batch(images: np.ndarray, labels: list[int], label: bytes) -> bytes:
    return pickle.dumps({b"batch_label": label, b"labels": labels, b"data": _rows(images),
                         b"filenames": [b"x.png"] * len(labels)}, protocol=2)


def _write_tarball(folder, members: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / cifar10.ARCHIVE, "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(f"{cifar10.FOLDER}/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


def _official_members() -> dict[str, bytes]:
    members = {"batches.meta": pickle.dumps({b"label_names": [b"airplane"]}, protocol=2),
               "readme.html": b"<html></html>"}  # present in the original, never read
    for b in range(5):
        start = b * PER_BATCH
        members[f"data_batch_{b + 1}"] = _batch(_images(PER_BATCH, start),
                                                [(start + k) % 10 for k in range(PER_BATCH)],
                                                b"training batch")
    members["test_batch"] = _batch(_images(PER_BATCH, 100), [9, 8, 7, 6], b"testing batch 1")
    return members


@pytest.fixture
def data_dir(tmp_path):
    _write_tarball(tmp_path / "cifar10", _official_members())
    return tmp_path


def _build(data_dir, name="cifar10", **keys):
    spec = {"name": name, "val_size": 4, "batch_size": 3,
            "seq_len": 1024 if name == "cifar10_classify" else 3072} | keys
    return DATA.build(spec, seed=0, data_dir=str(data_dir))


def test_decoding_keeps_the_channel_order_and_the_cache_replaces_the_tarball(data_dir):
    data = cifar10.load(data_dir)
    images, labels = data["train"]
    assert images.shape == (20, 32, 32, 3) and images.dtype == np.uint8
    assert isinstance(images, np.memmap) and data["test"][0].shape == (4, 32, 32, 3)
    i, row, col = 13, 5, 17  # pixel [row, col] of image i is its (red, green, blue) planes
    expected = [(i * 31 + row * 7 + col * 3 + ch * 85) % 256 for ch in range(3)]
    assert images[i, row, col].tolist() == expected
    assert np.array_equal(images, _images(20, 0))
    assert labels.tolist() == [k % 10 for k in range(20)] and data["test"][1].tolist() == [9, 8, 7, 6]
    for split in ("train", "test"):
        for path in cifar10._cache_paths(data_dir, split):
            assert path.is_file()
    assert not list((data_dir / "cifar10").glob("*.part"))  # written atomically

    (data_dir / "cifar10" / cifar10.ARCHIVE).unlink()  # a second build reads only the cache
    assert np.array_equal(cifar10.load(data_dir)["train"][0], images)


def test_splits_hold_out_the_last_val_size_training_images(data_dir):
    splits = cifar10.standard_splits(data_dir, val_size=4)
    assert {s: len(x) for s, (x, _) in splits.items()} == {"train": 16, "val": 4, "test": 4}
    assert np.array_equal(splits["val"][0], _images(4, 16))
    assert splits["val"][1].tolist() == [6, 7, 8, 9]
    with pytest.raises(ConfigError, match="data.val_size=20 must be between 1 and 19"):
        cifar10.standard_splits(data_dir, val_size=20)


def test_the_extracted_folder_is_read_too(tmp_path):
    folder = tmp_path / "cifar10" / cifar10.FOLDER
    folder.mkdir(parents=True)
    for name, payload in _official_members().items():
        (folder / name).write_bytes(payload)
    assert np.array_equal(cifar10.load(tmp_path)["test"][0], _images(4, 100))


def test_pixel_lm_batches_start_with_bos_and_predict_the_flattened_image(data_dir):
    dm = _build(data_dir)
    assert (dm.task, dm.unit, dm.vocab_size, dm.layout) == ("lm", "dims", 257, (32, 32, 3))
    assert {s: dm.split_size(s) for s in ("train", "val", "test")} == {"train": 16, "val": 4, "test": 4}
    inputs, targets = next(iter(dm.val_dataloader()))
    assert inputs.shape == targets.shape == (3, 3072) and inputs.dtype == torch.long
    assert (inputs[:, 0] == BOS_ID).all() and torch.equal(inputs[:, 1:], targets[:, :-1])
    assert torch.equal(targets[0], torch.from_numpy(_images(1, 16).reshape(-1)).long())
    inputs, targets = next(iter(dm.train_dataloader()))  # no trainer attached
    assert inputs.shape == (3, 3072)


def test_resolution_downsamples_and_seq_len_must_match(data_dir):
    dm = _build(data_dir, resolution=8, seq_len=192)
    inputs, targets = next(iter(dm.test_dataloader()))
    assert inputs.shape == (3, 192) and dm.layout == (8, 8, 3)
    box = _images(1, 100)[0, :4, :4].reshape(-1, 3).astype(float).mean(0)
    assert targets[0, :3].tolist() == np.rint(box).astype(int).tolist()
    with pytest.raises(ConfigError, match="set data.seq_len=192"):
        _build(data_dir, resolution=8)
    with pytest.raises(ConfigError, match="data.resolution=5"):
        _build(data_dir, resolution=5, seq_len=75)


def test_classify_gray_and_rgb_token_sequences(data_dir):
    dm = _build(data_dir, "cifar10_classify")
    assert (dm.task, dm.unit, dm.input_kind, dm.num_classes, dm.vocab_size, dm.pad_id) == \
        ("classify", "examples", "tokens", 10, 256, None)
    tokens, labels = next(iter(dm.test_dataloader()))
    assert tokens.shape == (3, 1024) and tokens.dtype == labels.dtype == torch.long
    assert labels.tolist() == [9, 8, 7]
    r, g, b = (int(v) for v in _images(1, 100)[0, 2, 5])  # image 0, row 2, column 5
    assert tokens[0, 2 * 32 + 5] == int(0.299 * r + 0.587 * g + 0.114 * b + 0.5)
    assert tokens.max() <= 255
    tokens, labels = next(iter(dm.train_dataloader()))  # no trainer attached
    assert tokens.shape == (3, 1024) and labels.shape == (3,)

    rgb = _build(data_dir, "cifar10_classify", channels="rgb", seq_len=3072)
    tokens, _ = next(iter(rgb.val_dataloader()))
    assert torch.equal(tokens[1], torch.from_numpy(_images(1, 17).reshape(-1)).long())
    with pytest.raises(ConfigError, match="set data.seq_len=3072"):
        _build(data_dir, "cifar10_classify", channels="rgb")
    with pytest.raises(ConfigError, match="data.channels=cmyk"):
        _build(data_dir, "cifar10_classify", channels="cmyk")


def test_gray_is_rounded_bt601_luma():
    pixels = np.array([[255, 255, 255], [0, 0, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255],
                       [10, 200, 30]], dtype=np.uint8)
    assert to_gray(pixels).tolist() == [255, 0, 76, 150, 29, 124]  # 0.299*10+0.587*200+0.114*30=123.81


class _Pwned:
    def __reduce__(self):
        return os.system, ("echo pwned > pwned.txt",)


def test_safe_unpickler_refuses_code_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    payload = pickle.dumps({b"data": _Pwned(), b"labels": [0]}, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match=r"refusing to load (posix|os|nt)\.system"):
        safe_pickle.loads(payload)
    members = _official_members() | {"data_batch_3": payload}
    _write_tarball(tmp_path / "cifar10", members)
    with pytest.raises(MissingDataError, match="data_batch_3 is not a CIFAR-10 python batch") as error:
        cifar10.load(tmp_path)
    assert "refusing" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "pwned.txt").exists()
    # numpy arrays and builtin containers still load
    plain = pickle.dumps({b"a": np.arange(3, dtype=np.uint8), b"b": [1, b"x"]}, protocol=2)
    assert safe_pickle.loads(plain)[b"a"].tolist() == [0, 1, 2]


def test_a_batch_that_is_not_a_cifar_dict_is_refused(tmp_path):
    members = _official_members() | {"test_batch": pickle.dumps({b"labels": [1]}, protocol=2)}
    _write_tarball(tmp_path / "cifar10", members)
    with pytest.raises(MissingDataError, match="test_batch is not a CIFAR-10 python batch.*"
                                               "place the original cifar-10-python.tar.gz"):
        cifar10.load(tmp_path)
    wrong_shape = {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}
    members = _official_members() | {"data_batch_1": pickle.dumps(wrong_shape)}
    _write_tarball(tmp_path / "cifar10", members)
    with pytest.raises(MissingDataError, match=r"uint8 \(n, 3072\)"):
        cifar10.load(tmp_path)


def test_a_tarball_without_every_batch_is_refused(tmp_path):
    members = _official_members()
    del members["data_batch_5"]
    _write_tarball(tmp_path / "cifar10", members)
    with pytest.raises(MissingDataError, match="lacks cifar-10-batches-py/data_batch_5"):
        cifar10.load(tmp_path)


@pytest.mark.parametrize("name", ["cifar10", "cifar10_classify"])
def test_offline_and_missing_fails_fast_naming_the_file_and_folder(tmp_path, name):
    assert os.environ.get("XBENCH_OFFLINE") == "1"  # tests/conftest.py
    started = time.perf_counter()
    with pytest.raises(MissingDataError) as error:
        _build(tmp_path / "nowhere", name)
    assert time.perf_counter() - started < 2
    message = str(error.value)
    assert "\n" not in message and "offline" in message
    assert str(tmp_path / "nowhere" / "cifar10" / "cifar-10-python.tar.gz") in message
