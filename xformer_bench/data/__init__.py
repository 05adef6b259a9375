"""Datasets.  Each variant module registers a builder ``build(*, seed, data_dir, **yaml)``
returning a LightningDataModule; its task is named by the datamodule's ``task`` attribute."""
