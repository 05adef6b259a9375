"""The batch sizes every data module takes: ``data.batch_size`` (training) and
``data.eval_batch_size`` (evaluation; null follows ``data.batch_size``)."""

from __future__ import annotations

from numbers import Integral

from xformer_bench.errors import ConfigError


def check_batch_sizes(batch_size: object, eval_batch_size: object = None) -> None:
    """:class:`ConfigError` unless each given batch size is a positive integer.

    A batch larger than a split is not an error: evaluation's last batch is simply partial,
    and training draws its windows or examples afresh at every step."""
    for key, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
        if value is None and key == "eval_batch_size":
            continue
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ConfigError(f"data.{key}={value} must be a positive integer (windows or "
                              "examples per batch)")
