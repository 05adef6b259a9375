"""The ``data`` group: the keys of every dataset, each dataset's own, and the input shape each
gives (:mod:`~.shapes`) -- for ``imagenet`` the one its ``mode`` selects."""

from __future__ import annotations

from xformer_bench.schema.group import NAMED, Group
from xformer_bench.schema.keys import Bool, Choice, Float, Int, Seq, Text
from xformer_bench.schema.shapes import TASKS

SPLITS = Seq("the train, val and test fractions of the corpus",
             item=Float("", 0, 1, open_lo=True, open_hi=True), length=3, total=1.0,
             says="three positive fractions (train, val, test) summing to 1")
SEEDED = {
    "n_train": Int("training examples per epoch", 1),
    "n_val": Int("validation examples", 1),
    "n_test": Int("test examples", 1),
    "data_seed": Int("seeds the examples, not the training", 0),
}
"""Generated examples: how many per split, from which seed."""
FRACTION = Float("", 0, 1, open_lo=True)

DATA = Group("data", common={
    **NAMED,
    "seq_len": Int("the model's input length", 1),
    "batch_size": Int("training examples (windows, sentence pairs) per step", 1),
    "eval_batch_size": Int("examples per evaluation batch", 1),
    "num_workers": Int("DataLoader worker processes", 0, computes=False),  # batches by step
    "val_subsample": Int("evaluation batches scored at each validation before the last (the "
                         "split's first ones); the last and the test score the whole split", 1,
                         null="the whole split at every validation"),
}, options={
    "associative_recall": {
        "n_pairs": Int("key-value pairs per example", 1),
        "n_keys": Int("the key alphabet", 1),
        "n_values": Int("the value alphabet", 2),
        **SEEDED,
    },
    "cifar10": {
        "resolution": Choice("box-downsampled side of the images", (32, 16, 8, 4, 2, 1)),
        "val_size": Int("official training images held out for validation", 1),
    },
    "cifar10_classify": {
        "channels": Choice("gray: 1024 luma tokens (LRA); rgb: 3072 sub-pixel tokens",
                           ("gray", "rgb")),
        "val_size": Int("official training images held out for validation", 1),
    },
    "copy": {
        "length": Int("symbols per half", 1),
        "n_symbols": Int("the alphabet, less the separator", 2),
        **SEEDED,
    },
    "enwik8": {},
    "imagenet": {
        "subset": Choice("the ImageNet subset (folder: data.path)",
                         ("imagenette", "imagewoof", "tiny_imagenet", "folder")),
        "path": Text("an ImageFolder DIR", null="the subset"),
        "hf_repo": Text("the Hub dataset of the subset", null="the subset's default"),
        "hf_config": Text("the Hub dataset's config", null="the subset's default"),
        "mode": Choice("classify: image classification; pixel_lm: bits per sub-pixel",
                       ("classify", "pixel_lm")),
        "resolution": Int("R: the model sees R x R images", 1),
        "cache_size": Int("classify: side of the cached square", 1,
                          null="data.resolution * 8 // 7"),
        "val_fraction": Float("of each class's training images, held out for validation", 0, 1,
                              open_lo=True, open_hi=True),
        "seq_len": Int("pixel_lm: R * R * 3; classify ignores it", 1),
        "resize": Choice("how an image becomes a square: its central square (crop) or all of "
                         "it (squash)", ("crop", "squash")),
        "crop_scale": Seq("classify, training: the random crop's area, as a [low, high] "
                          "fraction of the image's", item=FRACTION, length=2),
        "crop_ratio": Seq("classify, training: the random crop's aspect ratio w / h, [low, "
                          "high]", item=Float("", 0, open_lo=True), length=2),
        "flip": Float("classify, training: the probability of a left-right mirror", 0, 1),
    },
    "listops": {
        "max_length": Int("expressions have fewer tokens and are padded to it", 1),
        "min_length": Int("expressions have more tokens than this", 0),
        "max_depth": Int("the deepest nesting of operators", 1),
        "max_args": Int("the most arguments per operator", 2),
        **SEEDED,
    },
    "mqar": {
        "n_pairs": Int("key-value pairs per example, each queried once", 1),
        "vocab_size": Int("keys from 1 .. V/2 - 1, values from V/2 .. V - 1", 4),
        "power_a": Float("query gaps drawn ~ a g^(a - 1); 1: uniform", 0, open_lo=True),
        "random_non_queries": Bool("random tokens between the queries"),
        **SEEDED,
    },
    "synthetic": {
        "size": Int("bytes generated", 1),
        "splits": SPLITS,
    },
    "text": {
        "path": Text("the text file", null="none: data=text asks for one"),
        "splits": SPLITS,
    },
    "wmt14": {
        "path": Text("a folder of aligned sentence files", null="the Hugging Face data"),
        "src_suffix": Text("with data.path: source files {train,valid,test}.<src_suffix>"),
        "tgt_suffix": Text("with data.path: target files {train,valid,test}.<tgt_suffix>"),
        "direction": Text("Hugging Face data: source-target languages, e.g. en-de"),
        "subset": Int("the first N training pairs", 1, null="all"),
        "vocab_size": Int("the joint BPE vocabulary, at most", 1),
        "max_source_len": Int("training pairs with more source tokens are dropped", 1),
        "max_target_len": Int("training pairs with more target tokens are dropped", 1),
        "max_eval_len": Int("val / test sentences are truncated to this many tokens", 1,
                            null="data.seq_len - 1"),
    },
})

GIVES = {
    "associative_recall": {"token_lm": None},
    "cifar10": {"pixel_lm": None},
    "cifar10_classify": {"token_classes": None},
    "copy": {"token_lm": None},
    "enwik8": {"token_lm": None},
    "imagenet": {"image_classes": ("mode", "classify"), "pixel_lm": ("mode", "pixel_lm")},
    "listops": {"token_classes": None},
    "mqar": {"token_lm": None},
    "synthetic": {"token_lm": None},
    "text": {"token_lm": None},
    "wmt14": {"sentence_pairs": None},
}
"""The input shape each dataset gives: ``{kind: None}``, or ``{kind: (key, value)}`` where one
of its keys selects the shape."""


def given(node: dict) -> str | None:
    """The input shape the data ``node`` gives (None: a dataset without a declaration)."""
    for kind, condition in GIVES.get(node.get("name"), {}).items():
        if condition is None or node.get(condition[0]) == condition[1]:
            return kind
    return None


def task_of(node: dict) -> str | None:
    """The task that trains on the data ``node`` (``lm``, ``classify``, ``translate``), read
    from its declared shape without building it (None: a dataset without a declaration)."""
    return TASKS.get(given(node))


def fitting(kinds: tuple[str, ...]) -> list[str]:
    """The data settings that give one of ``kinds``: ``data=imagenet data.mode=classify``."""
    return [f"data={name}" + (f" data.{condition[0]}={condition[1]}" if condition else "")
            for name, gives in GIVES.items() for kind, condition in gives.items()
            if kind in kinds]
