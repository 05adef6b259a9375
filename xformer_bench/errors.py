"""Errors that reach the user as one actionable line (no traceback; ``XBENCH_DEBUG=1`` adds it)."""


class XbenchError(Exception):
    """Base class: the CLI prints ``error: <message>`` and exits non-zero."""


class MissingDataError(XbenchError):
    """A dataset is neither on disk nor downloadable; the message names the file to place."""


class ConfigError(XbenchError, ValueError):
    """An invalid or incompatible combination of options, caught before training.

    Also a :class:`ValueError` (a bad value): a component that used to raise ``ValueError``
    for a bad option can raise this instead without breaking callers that catch that."""


class DivergedError(XbenchError):
    """The training loss became NaN or infinite."""


class UnmeasuredError(XbenchError):
    """A run that ended without measuring what it promised (fewer steps than asked, a primary
    metric that is missing or not finite): recorded as ``failed``, never ``finished``."""
