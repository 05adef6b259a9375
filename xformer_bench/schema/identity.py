"""Which keys make a run's identity: the run id hashes what changes what a run computes -- the
data, the model, the optimisation, what is evaluated -- and nothing else.  Each declaration says
which it is (``computes=False``: :class:`~xformer_bench.schema.keys.Key`, a whole group by
:attr:`~xformer_bench.schema.group.Group.computes`), so turning off the progress bar or writing
checkpoints to resume an interrupted run is the same run, not a new row of its table.
"""

from __future__ import annotations

from functools import cache

from xformer_bench.schema.keys import Node
from xformer_bench.schema.validate import GROUPS, TOP_KEYS

HASHED_AS = {"trainer": {"progress_bar": False, "checkpoint": False, "log_every_n_steps": 10},
             "data": {"num_workers": 0}}
"""Keys outside the identity that records from before this split hashed: hashed at the value
every such record had (the shipped references and fixtures), whatever the run's value, so those
records keep their ids.  A constant, so no value of these keys changes an id."""


@cache
def outside_identity() -> dict[str, frozenset[str] | None]:
    """Top-level key or group -> None when all of it is outside the identity, else the set of
    its keys that are (only nodes with some)."""
    outside: dict[str, frozenset[str] | None] = {}
    for key, spec in TOP_KEYS.items():
        if not spec.computes:
            outside[key] = None
        elif isinstance(spec, Node) and (keys := {k for k, v in spec.keys.items()
                                                  if not v.computes}):
            outside[key] = frozenset(keys)
    for name, group in GROUPS.items():
        declared = [group.common, *group.options.values()]
        keys = {k for node in declared for k, v in node.items() if not v.computes}
        if not group.computes:
            outside[name] = None
        elif keys:
            outside[name] = frozenset(keys)
    return outside


def computing_part(config: dict) -> dict:
    """``config`` less every key outside the identity (:data:`HASHED_AS` keys at their constant)."""
    outside = outside_identity()
    kept = {k: v for k, v in config.items() if not (k in outside and outside[k] is None)}
    for name, keys in outside.items():
        node = kept.get(name)
        if keys is None or not isinstance(node, dict):
            continue
        pinned = HASHED_AS.get(name, {})
        kept[name] = {k: pinned.get(k, v) for k, v in node.items()
                      if k not in keys or k in pinned}
    return kept


@cache
def unread_by(task: str) -> dict[str, frozenset[str]]:
    """Group or top-level node -> its keys that ``task`` never reads (``read_by`` without it:
    ``model.tie_encoder_embedding`` on a decoder-only LM)."""
    declared = {name: [g.common, *g.options.values()] for name, g in GROUPS.items()}
    declared.update({k: [spec.keys] for k, spec in TOP_KEYS.items() if isinstance(spec, Node)})
    unread = {name: frozenset(k for node in nodes for k, v in node.items()
                              if v.read_by is not None and task not in v.read_by)
              for name, nodes in declared.items()}
    return {name: keys for name, keys in unread.items() if keys}
