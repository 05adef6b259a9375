"""Nothing silently assumed about images: the training crop's area and aspect ranges,
the mirror's probability and how an image becomes a square are keys of ``data=imagenet``
(``crop_scale``, ``crop_ratio``, ``flip``, ``resize``), their defaults the fixed augmentation
of before (Inception crop of 8-100 % of the area, a coin-flip mirror, the central square)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import compose_config
from test_data_imagenet import _image_folder
from xformer_bench.data import image_transforms as T
from xformer_bench.data.image_cache import square_pixels
from xformer_bench.data.imagenet import Augmentation
from xformer_bench.errors import ConfigError
from xformer_bench.registry import DATA

KEYS = ("resize", "crop_scale", "crop_ratio", "flip")


def test_the_defaults_are_the_augmentation_of_before():
    data = compose_config("data=imagenet")["data"]
    assert {k: data[k] for k in KEYS} == {"resize": "crop", "crop_scale": [0.08, 1.0],
                                          "crop_ratio": [0.75, 4 / 3], "flip": 0.5}
    assert Augmentation() == Augmentation(tuple(data["crop_scale"]), tuple(data["crop_ratio"]),
                                          data["flip"])
    image = np.random.default_rng(0).integers(0, 256, (20, 24, 3), dtype=np.uint8)
    old = np.random.default_rng(5)  # the fixed pipeline: crop, then mirror, one generator
    before = T.normalise(T.random_flip(T.random_resized_crop(image, 8, old), old))
    after = T.training_view(image, 8, np.random.default_rng(5), tuple(data["crop_scale"]),
                            tuple(data["crop_ratio"]), data["flip"])
    assert torch.equal(before, after)


def test_no_crop_and_no_flip_give_the_whole_image_every_time():
    image = np.random.default_rng(1).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    views = [T.training_view(image, 8, np.random.default_rng(seed), (1.0, 1.0), (1.0, 1.0), 0.0)
             for seed in range(5)]
    whole = T.normalise(T.resize(T.to_channels_first(image)[None], 8)[0])
    assert all(torch.equal(view, whole) for view in views)
    mirrored = [T.training_view(image, 8, np.random.default_rng(s), (1.0, 1.0), (1.0, 1.0), 1.0)
                for s in range(3)]
    assert all(torch.equal(view, whole.flip(-1)) for view in mirrored)


def test_squash_keeps_the_edges_the_central_square_cuts_off():
    stripes = np.zeros((10, 30, 3), dtype=np.uint8)
    stripes[:, :10, 0], stripes[:, 10:20, 1], stripes[:, 20:, 2] = 255, 255, 255  # R | G | B
    png = io.BytesIO()
    Image.fromarray(stripes).save(png, format="PNG")
    cropped = square_pixels(png.getvalue(), 6, "bilinear")
    squashed = square_pixels(png.getvalue(), 6, "bilinear+squash")
    assert cropped[:, 0, 1].min() > 200 and cropped[:, 0, 0].max() < 50  # green only
    assert squashed[:, 0, 0].min() > 200 and squashed[:, -1, 2].min() > 200  # red ... blue


def test_the_keys_reach_the_batches(tmp_path):
    folder = _image_folder(tmp_path / "folder")
    spec = {"name": "imagenet", "seq_len": 12288, "batch_size": 4, "resolution": 16,
            "val_fraction": 0.2, "path": str(folder), "resize": "squash",
            "crop_scale": [1.0, 1.0], "crop_ratio": [1.0, 1.0], "flip": 0.0}
    dm = DATA.build(spec, seed=0, data_dir=str(tmp_path / "data"))
    train = dm.splits["train"]
    assert train.augmentation == Augmentation((1.0, 1.0), (1.0, 1.0), 0.0)
    first = train.batch(np.arange(4), np.random.default_rng(0))[0]
    assert torch.equal(first, train.batch(np.arange(4), np.random.default_rng(1))[0])
    assert list((tmp_path / "data").rglob("train_18px_bilinear+squash.npy"))


@pytest.mark.parametrize("key, value", [("crop_scale", [0.9, 0.5]), ("crop_ratio", [2.0, 1.0]),
                                        ("resize", "stretch"), ("flip", 1.5)])
def test_a_bad_augmentation_is_one_line_before_any_file(key, value, tmp_path):
    spec = {"name": "imagenet", "seq_len": 12288, "batch_size": 4, key: value}
    with pytest.raises(ConfigError, match=f"data.{key}=") as error:
        DATA.build(spec, seed=0, data_dir=str(tmp_path / "data"))
    assert "\n" not in str(error.value) and not (tmp_path / "data").exists()
