"""ListOps expressions (Nangia & Bowman 2018, "ListOps: A Diagnostic Dataset for Latent Tree
Learning") drawn as the Long Range Arena draws them (Tay et al. 2021, "Long Range Arena: A
Benchmark for Efficient Transformers", ``lra_benchmarks/data/listops.py``): this module's own
implementation of the same distribution, with its own evaluator.

An expression is a digit 0-9 or an operator applied to 2 .. ``max_args`` expressions, written
in prefix form with the operator fused to its opening bracket, e.g.
``[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]`` (value 5).  Operators: ``[MIN``, ``[MAX``,
``[MED`` (median; of an even count, the mean of the two middle values rounded down -- LRA's
``int(np.median(args))``) and ``[SM`` (sum modulo 10).  Tree drawn top-down from depth 1: a
node above ``max_depth`` is an operator with probability :data:`OPERATOR_P` (0.25, LRA's
``VALUE_P``), else a uniform digit; a node at ``max_depth`` is a digit; an operator is uniform
over the four and takes a uniform 2 .. ``max_args`` arguments.  An expression is kept when its
token count (digits, operators and ``]``) lies strictly between ``min_length`` and
``max_length``, as LRA's ``min_length < length < max_length``; as in LRA (which collects a set)
no expression occurs twice in the data set.  Drawing stops as soon as an expression reaches
``max_length`` tokens: such an expression is rejected anyway, so the kept ones are distributed
exactly as LRA's.

Tokens: ``0`` padding, ``1 .. 10`` the digits 0 .. 9, ``11 .. 14`` the operators, ``15`` ``]``
(:data:`VOCAB`).  LRA's files also carry parentheses around each argument that its input
pipeline strips; they are never generated here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import numpy as np

PAD_ID = 0
DIGITS = tuple(str(d) for d in range(10))
OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VOCAB = ("<pad>", *DIGITS, *OPERATORS, END)
"""Token id -> text."""
TOKEN_ID = {text: i for i, text in enumerate(VOCAB)}
VOCAB_SIZE = len(VOCAB)  # 16
DIGIT_BASE = TOKEN_ID["0"]  # token of digit d: DIGIT_BASE + d
MIN_ID, MAX_ID, MED_ID, SM_ID = (TOKEN_ID[op] for op in OPERATORS)
END_ID = TOKEN_ID[END]
NUM_CLASSES = 10

OPERATOR_P = 0.25
"""Probability that a node above the maximum depth is an operator (LRA: ``r <= VALUE_P``)."""
SHORTEST = 4
"""Tokens of the shortest operator expression, ``[OP d d ]``."""


def median(args: list[int]) -> int:
    """LRA's ``int(np.median(args))`` for digits: the middle value, or of an even count the
    mean of the two middle values rounded down (``[MED 1 2 ]`` is 1, ``[MED 3 4 5 6 ]`` is 4)."""
    ordered = sorted(args)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) // 2


APPLY: dict[int, Callable[[list[int]], int]] = {
    MIN_ID: min,
    MAX_ID: max,
    MED_ID: median,
    SM_ID: lambda args: sum(args) % 10,
}
"""Operator token -> its function of the argument values."""


def encode(text: str) -> list[int]:
    """``"[MAX 4 [SM 3 9 ] ]"`` -> token ids (whitespace-separated tokens)."""
    try:
        return [TOKEN_ID[token] for token in text.split()]
    except KeyError as error:
        raise ValueError(f"not a ListOps token: {error.args[0]!r} (tokens: {' '.join(VOCAB[1:])})") from None


def decode(ids: Iterable[int]) -> str:
    """Token ids -> text, padding dropped."""
    return " ".join(VOCAB[int(i)] for i in ids if int(i) != PAD_ID)


def evaluate(ids: Iterable[int]) -> int:
    """The value 0-9 of one expression given as token ids (padding ignored): a stack machine,
    independent of the generator's own bookkeeping; ``ValueError`` for an ill-formed one."""
    stack: list[tuple[int, list[int]]] = []
    value = None
    for token in (int(i) for i in ids):
        if token == PAD_ID:
            continue
        if value is not None:
            raise ValueError("tokens after the end of the expression")
        if token in APPLY:
            stack.append((token, []))
            continue
        if token == END_ID:
            if not stack or len(stack[-1][1]) < 1:
                raise ValueError("']' without an open operator or its arguments")
            operator, args = stack.pop()
            result = APPLY[operator](args)
        elif DIGIT_BASE <= token < DIGIT_BASE + 10:
            result = token - DIGIT_BASE
        else:
            raise ValueError(f"not a ListOps token id: {token}")
        if stack:
            stack[-1][1].append(result)
        else:
            value = result
    if value is None or stack:
        raise ValueError("unbalanced or empty expression")
    return value


def evaluate_text(text: str) -> int:
    """The value of an expression written as text: ``evaluate_text("[SM 7 5 ]") == 2``."""
    return evaluate(encode(text))


class _TooLong(Exception):
    """The expression being drawn reached ``max_length`` tokens: it will be rejected."""


def sample(rng: random.Random, max_depth: int, max_args: int, max_length: int) -> tuple[list[int], int] | None:
    """One expression drawn from depth 1 (token ids, value), or None when it reached
    ``max_length`` tokens before it was complete."""
    draw = rng.random
    out: list[int] = []
    append = out.append
    operators = (MIN_ID, MAX_ID, MED_ID, SM_ID)

    def node(depth: int) -> int:
        if depth < max_depth and draw() <= OPERATOR_P:
            operator = operators[int(draw() * 4)]
            append(operator)
            args = [node(depth + 1) for _ in range(2 + int(draw() * (max_args - 1)))]
            append(END_ID)
            value = APPLY[operator](args)
        else:
            value = int(draw() * 10)
            append(DIGIT_BASE + value)
        if len(out) >= max_length:
            raise _TooLong
        return value

    try:
        value = node(1)
    except _TooLong:
        return None
    return out, value


def generate(n: int, rng: random.Random, *, min_length: int, max_length: int, max_depth: int,
             max_args: int, seen: set[bytes], progress: Callable[[int], object] | None = None,
             patience: int = 1_000_000) -> tuple[np.ndarray, np.ndarray]:
    """``n`` distinct expressions with ``min_length < length < max_length`` tokens, none in
    ``seen`` (which collects them): tokens uint8 (n, max_length) padded at the end with
    :data:`PAD_ID`, values uint8 (n,).  ``progress(1)`` after each kept expression; a
    ``ValueError`` after ``patience`` draws in a row without a new one (a length window too
    narrow, or too few distinct expressions in it)."""
    if not (max_args >= 2 and max_depth >= 2 and SHORTEST < max_length and min_length + 1 < max_length):
        raise ValueError(f"no ListOps expression has min_length={min_length} < length < "
                         f"max_length={max_length} tokens with max_depth={max_depth}, "
                         f"max_args={max_args}")
    tokens = np.zeros((n, max_length), dtype=np.uint8)
    values = np.zeros(n, dtype=np.uint8)
    kept, misses = 0, 0
    while kept < n:
        drawn = sample(rng, max_depth, max_args, max_length)
        if drawn is not None and len(drawn[0]) > min_length:
            key = bytes(drawn[0])
            if key not in seen:
                seen.add(key)
                tokens[kept, :len(key)] = drawn[0]
                values[kept] = drawn[1]
                kept, misses = kept + 1, 0
                if progress is not None:
                    progress(1)
                continue
        misses += 1
        if misses >= patience:
            raise ValueError(f"found only {kept} of {n} distinct ListOps expressions with "
                             f"{min_length} < length < {max_length} tokens after {patience} "
                             "draws without a new one: widen the length window")
    return tokens, values
