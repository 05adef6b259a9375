"""Datasets.  Each variant module registers a builder ``build(*, seed, data_dir, **yaml)``
returning a LightningDataModule whose ``task`` attribute names the task that trains on it
(a :data:`xformer_bench.tasks.TASK` name) and whose ``unit`` says what its evaluation counts
(``"bytes"``, ``"dims"``, ``"examples"``, ``"tokens"``)."""
