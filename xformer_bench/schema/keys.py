"""What a key may hold: one declaration per key -- its type, its range or choices, whether it may
be null (and what null means), and its meaning in a few words.

Each kind says three things the rest of the package uses:

* ``accepts(value)`` -- whether a value (as the config resolves it: int, float, bool, str,
  list, dict or None) is allowed;
* ``allowed()`` -- the allowed range in words, for the one ``error:`` line
  (``data.batch_size=0 must be a positive integer (training examples per step)``);
* ``outside()`` / ``inside()`` -- values just outside the range (0 or -1 below a minimum, a
  float for an integer, a string for a number, an unknown choice, null where null is not
  allowed) and on its edge: what the generated tests try on every key.

No torch here: the schema is checked before anything heavy is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

NOT_A_NUMBER = "many"
"""The string every numeric key is tried with."""
UNKNOWN_CHOICE = "no_such_choice"


def shown(value: Any) -> str:
    """A value as the command line writes it: null, true, [1, 2], {a: 1}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
    return str(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Key:
    """A key's declaration; ``null`` says what null means where the key may be null;
    ``computes=False`` marks a key that changes nothing a run computes (how it is shown,
    logged, checkpointed, resumed or where its files go): outside the run id
    (:mod:`xformer_bench.schema.identity`); ``read_by``: the tasks that read it (None: every
    task) -- elsewhere its value changes nothing, though the run id still hashes it."""

    meaning: str
    null: str | None = field(default=None, kw_only=True)
    says: str | None = field(default=None, kw_only=True)  # the range in words, when not derived
    computes: bool = field(default=True, kw_only=True)
    read_by: frozenset[str] | None = field(default=None, kw_only=True)

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.null is not None
        return self._accepts(value)

    def allowed(self) -> str:
        text = self.says or self._allowed()
        return f"{text}, or null ({self.null})" if self.null is not None else text

    def refusal(self, key: str, value: Any) -> str:
        """The one line for ``key=value``, a value this key does not accept."""
        return f"{key}={shown(value)} must be {self.allowed()} ({self.meaning})"

    def outside(self) -> list[Any]:
        return [v for v in [*self._outside(), *([] if self.null else [None])]
                if not self.accepts(v)]

    def inside(self) -> list[Any]:
        return [*self._inside(), *([None] if self.null else [])]

    def _accepts(self, value: Any) -> bool:
        raise NotImplementedError

    def _allowed(self) -> str:
        raise NotImplementedError

    def _outside(self) -> list[Any]:
        return []

    def _inside(self) -> list[Any]:
        return []


@dataclass(frozen=True)
class Int(Key):
    """An integer in ``[lo, hi]`` (either end open-ended when None)."""

    lo: int | None = None
    hi: int | None = None

    def _accepts(self, value):
        return (isinstance(value, int) and not isinstance(value, bool)
                and (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi))

    def _allowed(self):
        if self.hi is not None:
            return f"an integer between {self.lo} and {self.hi}"
        return {None: "an integer", 0: "an integer >= 0", 1: "a positive integer"}.get(
            self.lo, f"an integer >= {self.lo}")

    def _outside(self):
        below = [] if self.lo is None else [self.lo - 1, *([-1] if self.lo > 0 else [])]
        above = [] if self.hi is None else [self.hi + 1]
        return [*below, *above, (self.lo or 0) + 0.5, NOT_A_NUMBER, True]

    def _inside(self):
        return [v for v in (self.lo, self.hi) if v is not None] or [0]


@dataclass(frozen=True)
class Float(Key):
    """A finite number (an integer will do) in ``[lo, hi]``, an end excluded where ``open_lo``
    / ``open_hi``; never NaN nor infinite (``optim.lr=inf`` trained to a NaN loss: refused)."""

    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False
    open_hi: bool = False

    def _accepts(self, value):
        if not _number(value) or not math.isfinite(value):
            return False
        above_lo = self.lo is None or (value > self.lo if self.open_lo else value >= self.lo)
        below_hi = self.hi is None or (value < self.hi if self.open_hi else value <= self.hi)
        return above_lo and below_hi

    def _allowed(self):
        if self.lo is None and self.hi is not None:
            return f"a number {'<' if self.open_hi else '<='} {self.hi}"
        if self.hi is None:
            if self.lo == 0:
                return "a positive number" if self.open_lo else "a number >= 0"
            return "a number" if self.lo is None else \
                f"a number {'>' if self.open_lo else '>='} {self.lo}"
        left, right = "(" if self.open_lo else "[", ")" if self.open_hi else "]"
        return f"a number in {left}{self.lo}, {self.hi}{right}"

    def _step(self, edge: float) -> float:
        return 1e-3 * max(1.0, abs(edge))

    def _outside(self):
        edges = []
        if self.lo is not None:
            edges += [self.lo if self.open_lo else self.lo - self._step(self.lo), -1]
        if self.hi is not None:
            edges.append(self.hi if self.open_hi else self.hi + self._step(self.hi))
        return [*edges, NOT_A_NUMBER, float("nan"), float("inf"), True]

    def _inside(self):
        values = []
        if self.lo is not None:
            values.append(self.lo + self._step(self.lo) if self.open_lo else self.lo)
        if self.hi is not None:
            values.append(self.hi - self._step(self.hi) if self.open_hi else self.hi)
        return values or [0.5]


@dataclass(frozen=True)
class Bool(Key):
    def _accepts(self, value):
        return isinstance(value, bool)

    def _allowed(self):
        return "true or false"

    def _outside(self):
        return ["maybe", 2]

    def _inside(self):
        return [True, False]


@dataclass(frozen=True)
class Choice(Key):
    """One of ``choices`` (of the same type: the string ``"1"`` is not the integer 1)."""

    choices: tuple[Any, ...] = ()

    def _accepts(self, value):
        return any(value == c and type(value) is type(c) for c in self.choices)

    def _allowed(self):
        return "one of: " + ", ".join(shown(c) for c in self.choices)

    def refusal(self, key, value):
        choose = ", ".join(shown(c) for c in self.choices)
        null = f", or null ({self.null})" if self.null is not None else ""
        return (f"{key}={shown(value)} is not one of its choices; choose one of: {choose}{null} "
                f"({self.meaning})")

    def _outside(self):
        return [UNKNOWN_CHOICE]

    def _inside(self):
        return list(self.choices)


@dataclass(frozen=True)
class Text(Key):
    """A name, a label or a path: a string (a number the command line wrote is one too)."""

    def _accepts(self, value):
        return isinstance(value, str) or _number(value)

    def _allowed(self):
        return "a string"

    def _outside(self):
        return [[1, 2], {"a": 1}]

    def _inside(self):
        return ["a_name"]


@dataclass(frozen=True)
class FolderName(Text):
    """One folder's name (``experiment_name``): a string with no path separator, not empty, ``.``
    or ``..`` -- ``../escape`` once put its records outside ``paths.results_dir``, where no
    table reads them."""

    def _accepts(self, value):
        text = str(value) if _number(value) else value
        return (isinstance(text, str) and text not in ("", ".", "..")
                and not any(sep in text for sep in "/\\"))

    def _allowed(self):
        return "a folder name (no / or \\, not . or ..)"

    def _outside(self):
        return ["../escape", "a/b", "", *super()._outside()]


@dataclass(frozen=True)
class Seq(Key):
    """A list of ``length`` items (any number when None; none only where ``empty``), each
    ``item``, whose sum is ``total`` when given."""

    item: Key = None  # type: ignore[assignment]
    length: int | None = None
    total: float | None = None
    empty: bool = False  # whether [] will do

    def _accepts(self, value):
        if not isinstance(value, (list, tuple)) or not (value or self.empty):
            return False
        if self.length is not None and len(value) != self.length:
            return False
        if not all(self.item.accepts(v) for v in value):
            return False
        return self.total is None or abs(sum(value) - self.total) <= 1e-9

    def _allowed(self):
        size = f"{self.length} values" if self.length else \
            f"a{'' if self.empty else ' non-empty'} list of values"
        summed = f", summing to {self.total}" if self.total is not None else ""
        return f"{'a list of ' if self.length else ''}{size}, each {self.item.allowed()}{summed}"

    def _edge(self) -> list[Any]:
        first = next(v for v in self.item.inside() if v is not None)
        return [first] * (self.length or 1)

    def _outside(self):
        edge = self._edge()
        bad_items = [[bad, *edge[1:]] for bad in self.item.outside()]
        wrong_length = [edge + edge[:1]] if self.length else []
        return [*bad_items, *wrong_length, *([] if self.empty else [[]]), NOT_A_NUMBER]

    def _inside(self):
        return [] if self.total is not None else [self._edge()]


@dataclass(frozen=True)
class Either(Key):
    """A value of one of several kinds (``trainer.compile``: true, false or a backend name)."""

    kinds: tuple[Key, ...] = ()

    def _accepts(self, value):
        return any(kind.accepts(value) for kind in self.kinds)

    def _allowed(self):
        return " or ".join(kind.allowed() for kind in self.kinds)

    def _outside(self):
        return [v for kind in self.kinds for v in kind.outside() if not self.accepts(v)]

    def _inside(self):
        return [v for kind in self.kinds for v in kind.inside()]


@dataclass(frozen=True)
class OptionOf(Key):
    """An option of another group, named or as its node (``model.hybrid.attention``): a node's
    keys are checked as that group's option's."""

    group: str = ""

    def _accepts(self, value):
        return isinstance(value, (str, dict))

    def _allowed(self):
        return f"an option of {self.group}, by name or as its node"

    def _outside(self):
        return [1, [1, 2]]

    def _inside(self):
        return ["a_name"]


@dataclass(frozen=True)
class Mapping(Key):
    """A mapping whose keys are not fixed (a study's ``baseline: {model: vanilla}``): its
    consumer checks the entries."""

    def _accepts(self, value):
        return isinstance(value, dict)

    def _allowed(self):
        return "a mapping {key: value, ...}"

    def _outside(self):
        return [NOT_A_NUMBER, [1, 2]]

    def _inside(self):
        return [{}]


@dataclass(frozen=True)
class Node(Key):
    """A mapping of declared keys (``eval``, ``optim``), each checked in turn; a key it does
    not declare is refused."""

    keys: dict[str, Key] = field(default_factory=dict)

    def _accepts(self, value):
        return isinstance(value, dict)

    def _allowed(self):
        return "a mapping of " + ", ".join(self.keys)

    def _outside(self):
        return [NOT_A_NUMBER]
