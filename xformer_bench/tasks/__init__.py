"""LightningModules, one per task; a datamodule's ``task`` attribute names its module."""
