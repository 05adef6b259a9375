"""Tasks: the LightningModules that train and evaluate a model on a datamodule's batches.

``run.py`` builds the task a datamodule names (its ``task`` attribute, e.g. ``"lm"``) through
:data:`TASK`.  A task module registers ``build(config, datamodule) -> LightningModule`` under
that name (``@TASK.register("lm")``); adding a task never touches shared code.  The module it
returns exposes what the run record reads:

- ``model``: the network (parameter and FLOP counts),
- ``metrics``: its :class:`~xformer_bench.metric_spec.MetricSpec` s, the primary one first,
  each logged as ``val/<name>`` and ``test/<name>``, next to ``val/loss`` and ``test/loss``,
- ``unit`` and ``evaluated_units``: what evaluation counts (``"bytes"``, ``"dims"``,
  ``"examples"``, ``"tokens"``) and how many it counted per split (``{"val": n, "test": n}``).

A task never imports a dataset module: conventions both share live in :mod:`xformer_bench.targets`.
"""

from xformer_bench.registry import Registry

TASK = Registry("task", "xformer_bench.tasks")
