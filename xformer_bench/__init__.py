"""xbench: regenerate comparisons of Transformer modifications from one command."""

__version__ = "0.1.0"
