"""Datasets.  Each variant module registers a builder ``build(*, seed, data_dir, **yaml)``
returning a LightningDataModule whose ``task`` attribute names the task that trains on it
(a :data:`xformer_bench.tasks.TASK` name) and whose ``unit`` says what its evaluation counts
(``"bytes"``, ``"dims"``, ``"examples"``, ``"tokens"``).

What each task reads from its datamodule (the contract; batches are tuples of tensors):

- ``task = "lm"`` (bytes of text, sub-pixels of images, tokens of a synthetic task):
  ``vocab_size``; batches ``(inputs, targets)``, int64 (B, T), targets ``IGNORE_INDEX``
  (:mod:`xformer_bench.targets`) where nothing is scored.  Images also set ``layout``
  ``(height, width, channels)``: the order their sub-pixels are flattened in (raster,
  channels interleaved), for per-axis positions and for drawing samples; their sequences start
  with ``bos_id`` (= ``vocab_size - 1``, never a target) so that every dimension is predicted.
  Recall tasks set ``scores_accuracy = True`` (MQAR): the task then reports, first, the
  accuracy of the most likely token at the scored positions.
- ``task = "classify"``: ``num_classes`` and ``input_kind``: ``"tokens"`` (``vocab_size``,
  ``pad_id`` or None; inputs int64 (B, T), padded at the end with ``pad_id``) or ``"image"``
  (``image_shape`` (C, H, W); inputs float32 (B, C, H, W), normalised); batches
  ``(inputs, labels)``, labels int64 (B,).
- ``task = "translate"``: a shared ``vocab_size`` and ``pad_id``, ``bos_id``, ``eos_id``;
  ``decode(ids) -> str`` (detokenised text); training batches ``(source (B, S), target (B, T))``
  int64 padded with ``pad_id``, each target ``bos ... eos``; evaluation batches add
  ``index`` (B,), the examples' positions in ``references(split) -> list[str]``, the raw
  reference sentences BLEU is computed against.

Whole-example data builds on :mod:`xformer_bench.data.example_batches` (seeded, resumable
batches of examples); byte streams on :mod:`xformer_bench.data.byte_windows`.  Files are looked
for locally first, then downloaded (:mod:`xformer_bench.data.download`); offline, a missing file
is one :class:`~xformer_bench.errors.MissingDataError` line naming what to place where.
"""
