"""Errors that reach the user as one actionable line (no traceback)."""


class XbenchError(Exception):
    """Base class: the CLI prints ``error: <message>`` and exits non-zero."""


class MissingDataError(XbenchError):
    """A dataset is neither on disk nor downloadable; the message names the file to place."""


class ConfigError(XbenchError):
    """An invalid or incompatible combination of options, caught before training."""


class DivergedError(XbenchError):
    """The training loss became NaN or infinite."""
