"""Normalisation layers.  Builders take ``dim`` plus the keys of their YAML."""
