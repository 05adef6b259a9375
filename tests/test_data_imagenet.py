"""ImageNet subsets on generated fixtures: a local ImageFolder of small PNGs and a Parquet
shard in the Hugging Face image layout.  Classification batches and their augmentation, the
validation carve, the cache, the pixel LM, the one-line errors offline."""

from __future__ import annotations

import io
import json
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from conftest import compose_config
from xformer_bench.data import image_transforms as T
from xformer_bench.data.example_batches import TrainingBatches
from xformer_bench.data.imagenet import carve_validation
from xformer_bench.data.pixels import BOS_ID
from xformer_bench.errors import ConfigError, MissingDataError
from xformer_bench.registry import DATA

COLOURS = {"blue": (20, 30, 230), "green": (30, 220, 40), "red": (240, 20, 30)}  # sorted: 0, 1, 2
SIZES = [(40, 30), (30, 50), (36, 36), (48, 24), (26, 34)]  # (width, height): mixed shapes
R = 16  # resolution in these tests; the cache holds 16 * 8 // 7 = 18 px squares


def _png(rgb, size, seed: int) -> bytes:
    """A mostly ``rgb`` image with a little noise, as PNG bytes."""
    noise = np.random.default_rng(seed).integers(-15, 16, (size[1], size[0], 3))
    pixels = np.clip(np.array(rgb) + noise, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _image_folder(root, classes=COLOURS, n_train=5, n_val=2, val_extra=()):
    for split, n in (("train", n_train), ("val", n_val)):
        for c, name in enumerate(list(classes) + (list(val_extra) if split == "val" else [])):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                suffix = ".PNG" if i == 0 else ".png"  # extensions in any case
                (folder / f"img{i}{suffix}").write_bytes(
                    _png(classes.get(name, (0, 0, 0)), SIZES[i % len(SIZES)], 100 * c + i))
    return root


@pytest.fixture
def folder(tmp_path):
    return _image_folder(tmp_path / "folder")


def _build(data_dir, **keys):
    spec = {"name": "imagenet", "seq_len": 12288, "batch_size": 4, "resolution": R,
            "val_fraction": 0.2} | keys
    return DATA.build(spec, seed=0, data_dir=str(data_dir))


def _colour_class(inputs: torch.Tensor) -> torch.Tensor:
    """The dominant channel of each normalised image, as a class of COLOURS (b=0, g=1, r=2)."""
    mean, std = torch.tensor(T.IMAGENET_MEAN), torch.tensor(T.IMAGENET_STD)
    rgb = inputs.mean(dim=(2, 3)) * std + mean  # (B, 3) in 0..1
    return torch.tensor([2, 1, 0])[rgb.argmax(dim=1)]


def test_classify_batches_shapes_labels_and_deterministic_evaluation(tmp_path, folder):
    dm = _build(tmp_path / "data", path=str(folder))
    assert (dm.task, dm.unit, dm.input_kind, dm.num_classes, dm.image_shape) == \
        ("classify", "examples", "image", 3, (3, R, R))
    # 5 training images per class, 1 of each held out (round(0.2 * 5)); val/ is the test split
    sizes = {s: dm.split_size(s) for s in ("train", "val", "test")}
    assert sizes == {"train": 12, "val": 3, "test": 6}
    batches = [list(dm.test_dataloader()), list(dm.test_dataloader())]
    inputs, labels = batches[0][0]
    assert inputs.shape == (4, 3, R, R) and inputs.dtype == torch.float32
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 0, 1, 1]  # sorted folders
    for (a, la), (b, lb) in zip(*batches):
        assert torch.equal(a, b) and torch.equal(la, lb)
        assert torch.equal(_colour_class(a), la)
    val_inputs, val_labels = next(iter(dm.val_dataloader()))
    assert val_labels.tolist() == [0, 1, 2] and torch.equal(_colour_class(val_inputs), val_labels)


def test_training_augmentation_depends_only_on_seed_and_step(tmp_path, folder):
    dm = _build(tmp_path / "data", path=str(folder))
    a = TrainingBatches(dm.splits["train"], 4, seed=3, steps=10)
    b = TrainingBatches(dm.splits["train"], 4, seed=3, steps=10)
    (x5, y5), (x6, _) = a[5], a[6]
    assert x5.shape == (4, 3, R, R) and y5.dtype == torch.int64
    assert torch.equal(x5, b[5][0]) and torch.equal(y5, b[5][1])
    assert not torch.equal(x5, x6)
    assert torch.equal(_colour_class(x5), y5)  # crops of a class's colour keep its colour
    first, _ = next(iter(dm.train_dataloader()))  # no trainer attached: step 0 of seed 0
    assert torch.equal(first, TrainingBatches(dm.splits["train"], 4, seed=0, steps=1)[0][0])


def test_random_resized_crop_box_stays_inside_with_allowed_area_and_ratio():
    rng = np.random.default_rng(0)
    for height, width in [(18, 18), (30, 50), (7, 90)]:
        for _ in range(200):
            top, left, h, w = T.random_resized_crop_box(height, width, rng)
            assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
            assert h >= 1 and w >= 1
            if (height, width) != (7, 90):  # extreme shapes may fall back to the centre box
                assert 0.08 * height * width * 0.7 <= h * w
                assert 3 / 4 * 0.7 <= w / h <= 4 / 3 * 1.3  # rounding at small sizes
    assert T.random_resized_crop_box(4, 100, rng, scale=(0.99, 1.0)) == (0, 47, 4, 5)  # fallback
    image = np.random.default_rng(1).integers(0, 256, (30, 50, 3), dtype=np.uint8)
    out = T.random_resized_crop(image, 16, np.random.default_rng(2))
    assert out.shape == (3, 16, 16) and out.dtype == torch.float32
    whole = T.random_resized_crop(image[:16, :16], 16, rng, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert torch.equal(whole, torch.from_numpy(image[:16, :16]).permute(2, 0, 1).float())


def test_flip_mirrors_left_right_about_half_the_time():
    image = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4)
    outcomes = [T.random_flip(image, np.random.default_rng(s)) for s in range(200)]
    flipped = [torch.equal(o, torch.flip(image, dims=[-1])) for o in outcomes]
    assert all(f or torch.equal(o, image) for f, o in zip(flipped, outcomes))
    assert 70 < sum(flipped) < 130
    assert torch.equal(torch.flip(image, dims=[-1])[0, 0], torch.tensor([3.0, 2.0, 1.0, 0.0]))


def test_centre_crop_and_normalise():
    images = np.arange(2 * 6 * 6 * 3, dtype=np.uint8).reshape(2, 6, 6, 3)
    assert np.array_equal(T.centre_crop(images, 4), images[:, 1:5, 1:5])
    grey = T.normalise(torch.full((3, 2, 2), 255.0 * 0.456))
    assert torch.allclose(grey[1], torch.zeros(2, 2), atol=1e-6)


def test_validation_carve_is_per_class_fixed_and_disjoint():
    labels = np.repeat(np.arange(4), [1, 2, 50, 200])
    train, val = carve_validation(labels, 0.02)
    assert np.bincount(labels[val], minlength=4).tolist() == [0, 1, 1, 4]
    assert len(np.intersect1d(train, val)) == 0 and len(train) + len(val) == len(labels)
    again = carve_validation(labels, 0.02)
    assert np.array_equal(again[1], val)
    with pytest.raises(ConfigError, match="no class has 2 training images"):
        carve_validation(np.arange(3), 0.5)


def test_one_class_and_unknown_val_class_are_one_line_errors(tmp_path):
    one = _image_folder(tmp_path / "one", classes={"red": COLOURS["red"]})
    with pytest.raises(ConfigError, match="at least 2") as error:
        _build(tmp_path / "data", path=str(one))
    assert "\n" not in str(error.value)
    odd = _image_folder(tmp_path / "odd", val_extra=("purple",))
    with pytest.raises(ConfigError, match="val/purple is not a class of train/"):
        _build(tmp_path / "data", path=str(odd))
    with pytest.raises(ConfigError, match="data.subset=folder needs data.path=DIR"):
        _build(tmp_path / "data", subset="folder")


def test_cache_is_reused_without_the_images(tmp_path, folder):
    data_dir = tmp_path / "data"
    before = list(_build(data_dir, path=str(folder)).test_dataloader())
    assert not list(data_dir.rglob("*.part"))  # written atomically
    shutil.rmtree(folder)
    after = list(_build(data_dir, path=str(folder)).test_dataloader())
    for (a, la), (b, lb) in zip(before, after):
        assert torch.equal(a, b) and torch.equal(la, lb)


def _parquet_shard(path, split: str, per_class: int = 3):
    """A shard as the Hub serves image datasets: image {bytes, path} struct, label int64,
    the datasets features in the schema metadata."""
    cells, labels = [], []
    for c, rgb in enumerate(COLOURS.values()):
        for i in range(per_class):
            cells.append({"bytes": _png(rgb, SIZES[i], 10 * c + i), "path": f"{split}_{c}_{i}.png"})
            labels.append(c)
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    features = {"image": {"_type": "Image"},
                "label": {"names": list(COLOURS), "_type": "ClassLabel"}}
    schema = pa.schema([("image", image_type), ("label", pa.int64())],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(pa.table({"image": cells, "label": labels}, schema=schema), path)


def test_parquet_shards_in_the_hub_layout_work_offline(tmp_path):
    home = tmp_path / "data" / "imagenet" / "imagenette"
    home.mkdir(parents=True)
    _parquet_shard(home / "train-00000-of-00001.parquet", "train", per_class=4)
    _parquet_shard(home / "validation-00000-of-00001.parquet", "validation", per_class=2)
    dm = _build(tmp_path / "data", subset="imagenette")
    assert dm.num_classes == 3 and dm.split_size("test") == 6 and dm.split_size("val") == 3
    inputs, labels = next(iter(dm.test_dataloader()))
    assert inputs.shape == (4, 3, R, R) and labels.tolist() == [0, 0, 1, 1]
    assert torch.equal(_colour_class(inputs), labels)
    classes = json.loads(next(home.glob("cache-*/classes.json")).read_text())
    assert classes == list(COLOURS)


def test_offline_with_nothing_local_fails_fast_naming_what_to_place_where(tmp_path):
    started = time.perf_counter()
    with pytest.raises(MissingDataError) as error:
        _build(tmp_path / "data", subset="tiny_imagenet")
    message = str(error.value)
    assert time.perf_counter() - started < 2 and "\n" not in message
    assert "data.path=DIR" in message and "offline" in message
    assert str((tmp_path / "data" / "imagenet" / "tiny_imagenet").resolve()) in message


def test_pixel_lm_sequences_start_with_bos_and_predict_the_box_filtered_image(tmp_path):
    grid = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    root = tmp_path / "pixels"
    for split in ("train", "val"):
        for c in range(2):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(2):  # 16 x 16: each pixel of grid[c] as a 2 x 2 block
                big = np.kron(grid[c], np.ones((2, 2, 1), dtype=np.uint8))
                Image.fromarray(big).save(root / split / f"c{c}" / f"{i}.png")
    dm = _build(tmp_path / "data", path=str(root), mode="pixel_lm", resolution=8, seq_len=192)
    assert (dm.task, dm.unit, dm.vocab_size, dm.layout) == ("lm", "dims", 257, (8, 8, 3))
    inputs, targets = next(iter(dm.test_dataloader()))
    assert inputs.shape == targets.shape == (4, 192) and inputs.dtype == torch.long
    assert (inputs[:, 0] == BOS_ID).all() and torch.equal(inputs[:, 1:], targets[:, :-1])
    assert targets[0].tolist() == grid[0].reshape(-1).tolist()
    assert targets[3].tolist() == grid[1].reshape(-1).tolist()
    train_inputs, _ = next(iter(dm.train_dataloader()))
    assert train_inputs.shape == (4, 192)
    with pytest.raises(ConfigError, match=r"set data.seq_len=192"):
        _build(tmp_path / "elsewhere", path=str(root), mode="pixel_lm", resolution=8)


def test_yaml_keys_build_and_feed_a_vit(tmp_path, folder):
    from xformer_bench.models.build import build_classifier

    config = compose_config("data=imagenet", "model=vit", f"data.path={folder}",
                            f"data.resolution={R}", "data.val_fraction=0.2",
                            "model.d_model=32", "model.n_heads=2", "model.n_layers=1",
                            "model.d_ff=64")
    dm = DATA.build(config["data"], seed=0, data_dir=str(tmp_path / "data"))
    model = build_classifier(config, dm)
    inputs, labels = next(iter(dm.test_dataloader()))
    assert inputs.shape == (6, 3, R, R)  # eval_batch_size 64: the whole test split
    assert model(inputs).shape == (6, 3) and dm.num_classes == 3


def test_a_saved_hugging_face_dataset_is_read_as_the_hub_download_is(tmp_path):
    import datasets

    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=list(COLOURS))})
    splits = {}
    for split, per_class in (("train", 3), ("valid", 1)):  # tiny_imagenet names its test "valid"
        rows = [(Image.open(io.BytesIO(_png(rgb, SIZES[i], 7 * c + i))), c)
                for c, rgb in enumerate(COLOURS.values()) for i in range(per_class)]
        splits[split] = datasets.Dataset.from_dict(
            {"image": [r[0] for r in rows], "label": [r[1] for r in rows]}, features=features)
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "data/imagenet/tiny_imagenet/hf"))
    dm = _build(tmp_path / "data", subset="tiny_imagenet", val_fraction=0.3)
    assert dm.num_classes == 3 and dm.split_size("train") == 6 and dm.split_size("test") == 3
    inputs, labels = next(iter(dm.test_dataloader()))
    assert labels.tolist() == [0, 1, 2] and torch.equal(_colour_class(inputs), labels)
