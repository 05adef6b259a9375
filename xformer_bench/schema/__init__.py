"""The configuration's schema: every key of every group and option in ``conf/``, and the keys
outside groups, declared with its type, its range or choices and its meaning -- checked before
anything heavy is imported (:mod:`xformer_bench.preflight`), so a value out of range is one
``error:`` line naming the key and what it may be, never a run that trains on it.

One module per family of declarations (:mod:`.keys` holds the kinds of value):

* :mod:`.top` -- ``conf/config.yaml``'s own keys (``seed``, ``eval``, ``paths``, ``optim`` ...);
* :mod:`.study` -- what a study declares (``baseline``, ``sweep``, ``ladders`` ...);
* :mod:`.model` -- the ``model`` keys, the input shape each preset is for, ``modification``;
* :mod:`.data` -- each dataset's keys and the input shape it gives;
* :mod:`.attention`, :mod:`.layers` -- the parts' options;
* :mod:`.training` -- ``trainer`` and ``logger``;
* :mod:`.shapes` -- the input shapes a preset is for and a dataset gives.

:mod:`.validate` checks a composed config against them (the preflight's
:func:`check_config`), :mod:`.folders` that the folders a run writes can be written, and
:mod:`.coverage` that ``conf/`` and the declarations agree.

**Declaring a new option's keys.**  An option ``conf/<group>/<name>.yaml`` gets one entry in
its group's ``options`` -- ``"name": {"window": Int("keys per query", 1)}``, or ``"name": {}``
when its YAML has only ``name`` and ``label`` -- with the kinds of :mod:`.keys`: ``Int(meaning,
lo, hi)``, ``Float(meaning, lo, hi, open_lo=, open_hi=)``, ``Bool``, ``Choice(meaning,
choices)``, ``Text``, ``Seq(meaning, item=, length=)``, ``Either(meaning, kinds)``, ``Node``
(declared sub-keys), ``OptionOf(meaning, group=)`` (another group's option), each with
``null="what null means"`` where null is allowed.  A new model preset declares the inputs it is
for in :data:`.model.INPUTS` (or :data:`.shapes.ANY`), a new dataset the shape it gives in
:data:`.data.GIVES`.  ``tests/test_schema.py`` fails, naming the key, until the YAML and its
declaration agree (a key with no declaration, a declaration no YAML writes), and
``tests/test_schema_bad_values.py`` then tries the values just outside each new range.
"""

from xformer_bench.schema.folders import check_folders, unwritable
from xformer_bench.schema.validate import GROUPS, TOP_KEYS, check_config, check_inputs

__all__ = ["GROUPS", "TOP_KEYS", "check_config", "check_folders", "check_inputs", "unwritable"]
