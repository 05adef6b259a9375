"""The shapes of input a dataset gives and a model preset is for: a preset meant for one shape
(ViT: images cut into patches) given data of another (a byte corpus) is refused before training,
naming the data that would fit, unless it declares itself shape-agnostic (:data:`ANY`)."""

from __future__ import annotations

KINDS = {
    "token_lm": "a token sequence to continue (language modelling)",
    "pixel_lm": "image sub-pixels in raster order to continue (pixel language modelling)",
    "token_classes": "a token sequence to classify",
    "image_classes": "images to classify, cut into patches",
    "sentence_pairs": "pairs of sentences to translate",
}
"""Every input shape, in the words of the error."""

TASKS = {"token_lm": "lm", "pixel_lm": "lm", "token_classes": "classify",
         "image_classes": "classify", "sentence_pairs": "translate"}
"""The task (:data:`xformer_bench.tasks.TASK`) that trains on each shape: the ``task`` its
datamodule names."""

ANY = "any"
"""A preset whose architecture adapts to every shape above (the task builds the assembly)."""
