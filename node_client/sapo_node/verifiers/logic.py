"""propositional_logic, scored by our own parser: reasoning-gym's score, in linear time.

reasoning-gym 0.1.25 parses an answer with `parse_expr`, which strips, checks for enclosing
parentheses and scans the whole text once per operator level at every level of recursion: quadratic
(511 `¬` then `P` cost 0.7 s, 900 cost 2 s; deeper input raises RecursionError). It then builds the
whole truth table as a list of dicts over every distinct atom, and an atom is any text without an
operator at the top level (`a`, `x1`, `foo bar`): 34 lowercase atoms ask for 2^34 dicts, which
exhausts memory.

This module computes the same parse tree without rescanning, and evaluates it over all assignments
at once with integers as bit sets (bit `i` of a formula's value is its truth under assignment `i`),
so the cost is linear in the answer's length times the table's width (2^atoms bits). The number of
distinct atoms is bounded (MAX_ATOMS); an answer with more scores 0 (reasoning-gym would give it
0.05, or 0.25 or 1.0 when the premises are contradictory, after exponential work).

How `parse_expr(s)` builds its tree, and how each step is answered here without rescanning:

1. `s = s.strip()`; empty is an error. Here: precomputed next and previous non-space positions.
2. If `s` starts with `(` and ends with `)` and the text between never closes more parentheses than
   it opened and ends balanced, parse the inside. That holds exactly when the `(` at the start is
   matched, by ordinary stack matching over the whole answer, with the `)` at the end (a position's
   match depends only on the text after it).
3. For each binary operator, lowest precedence first (`↔`, `→`, `∨`, `∧`), take its rightmost
   occurrence at paren level 0, the level counted from the right end of `s` (`)` adds one, `(`
   takes one away), and split there. With D[i] = that count over everything after position i in the
   whole answer, position i is at level 0 in s[a:b] exactly when D[i] == D[b-1]; the occurrences of
   each operator are kept per D value in increasing order, so the rightmost one before b is a
   binary search.
4. If `s` starts with `¬`, negate the parse of the rest.
5. Otherwise `s` is an atom, named by its text.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from functools import lru_cache
from typing import Any

#: Distinct atoms (the premises' variables included) above which an answer scores 0. The premises of
#: the catalogue's configuration use at most 4 variables; 12 keeps a table of 4,096 bits.
MAX_ATOMS = 12

NOT, AND, OR, IMPLIES, IFF = "¬", "∧", "∨", "→", "↔"
# Codes in a postfix program: atoms are their index (>= 0), operators are negative.
_NOT, _AND, _OR, _IMPLIES, _IFF = -1, -2, -3, -4, -5
_BINARY = ((IFF, _IFF), (IMPLIES, _IMPLIES), (OR, _OR), (AND, _AND))  # the order parse_expr tries them
_UPPER = re.compile(r"[A-Z]")


class TooManyAtoms(ValueError):
    pass


def _compile(s: str, atoms: dict[str, int]) -> list[int]:
    """The postfix program of `s` as reasoning-gym's `parse_expr` would parse it; new atoms are added
    to `atoms`. Raises ValueError where parse_expr does (an empty part) and TooManyAtoms."""
    n = len(s)
    if n == 0:
        raise ValueError("empty expression")
    space = [c.isspace() for c in s]
    # Next non-space at or after i (n if none), and last non-space before i (-1 if none).
    nxt = [n] * (n + 1)
    for i in range(n - 1, -1, -1):
        nxt[i] = nxt[i + 1] if space[i] else i
    last = [-1] * (n + 1)
    for i in range(n):
        last[i + 1] = last[i] if space[i] else i
    # depth[i]: ")" minus "(" strictly after i. match[i]: the ")" that closes the "(" at i.
    depth = [0] * n
    match: dict[int, int] = {}
    # Positions of each binary operator, grouped by depth, increasing (filled left to right).
    where: dict[str, dict[int, list[int]]] = {op: {} for op, _ in _BINARY}
    d = 0
    for i in range(n - 1, -1, -1):
        depth[i] = d
        c = s[i]
        if c == ")":
            d += 1
        elif c == "(":
            d -= 1
    opened: list[int] = []
    for i, c in enumerate(s):
        if c == "(":
            opened.append(i)
        elif c == ")":
            if opened:
                match[opened.pop()] = i
        elif c in where:
            where[c].setdefault(depth[i], []).append(i)
    present = [(where[op], code) for op, code in _BINARY if where[op]]  # lowest precedence first

    # Work items: a span [a, b) to parse, encoded a * (n + 1) + b (>= 0), or an operator code (< 0)
    # to emit once its operands are done.
    width = n + 1
    program: list[int] = []
    todo = [n]  # the span [0, n)
    while todo:
        item = todo.pop()
        if item < 0:
            program.append(item)
            continue
        a, b = divmod(item, width)
        a = nxt[a]
        if a >= b:
            raise ValueError("empty expression")
        b = last[b] + 1
        if s[a] == "(" and s[b - 1] == ")" and match.get(a) == b - 1:
            todo.append((a + 1) * width + b - 1)
            continue
        level = depth[b - 1]
        for table, code in present:
            positions = table.get(level)
            if positions:
                k = bisect_left(positions, b) - 1
                if k >= 0 and positions[k] >= a:
                    i = positions[k]
                    todo += [code, (i + 1) * width + b, a * width + i]  # popped: left, right, then the operator
                    break
        else:
            if s[a] == NOT:
                todo += [_NOT, (a + 1) * width + b]
                continue
            index = atoms.setdefault(s[a:b], len(atoms))
            if len(atoms) > MAX_ATOMS:
                raise TooManyAtoms(f"more than {MAX_ATOMS} distinct atoms")
            program.append(index)
    return program


def _truth(program: list[int], columns: list[int], full: int) -> int:
    """The bit set of assignments under which `program` is true."""
    stack: list[int] = []
    for code in program:
        if code >= 0:
            stack.append(columns[code])
        elif code == _NOT:
            stack[-1] ^= full
        else:
            right = stack.pop()
            left = stack[-1]
            if code == _AND:
                stack[-1] = left & right
            elif code == _OR:
                stack[-1] = left | right
            elif code == _IMPLIES:
                stack[-1] = (left ^ full) | right
            else:  # _IFF
                stack[-1] = full ^ left ^ right
    return stack[0]


def _columns(k: int) -> tuple[list[int], int]:
    """For k atoms: each atom's truth over the 2^k assignments (atom j is bit j of the assignment's
    number), and the set of all assignments."""
    rows = 1 << k
    full = (1 << rows) - 1
    columns = []
    for j in range(k):
        half = 1 << j
        block = ((1 << half) - 1) << half  # half zeros then half ones
        columns.append(block * (full // ((1 << (2 * half)) - 1)))  # the block repeated over all rows
    return columns, full


@lru_cache(maxsize=4096)
def _premises(premises: tuple[str, ...]) -> tuple[dict[str, int], tuple[list[int], ...]]:
    atoms: dict[str, int] = {}
    return atoms, tuple(_compile(p, atoms) for p in premises)


def score(answer: str, entry: dict[str, Any]) -> float:
    """reasoning-gym's `PropositionalLogicDataset.score_answer(answer, entry)`: 1.0 for a valid,
    non-trivial conclusion, 0.25 for a valid trivial one (an atom, or a tautology), 0.05 for a
    conclusion that does not follow, 0.0 for an unknown variable or an answer that does not parse;
    0.0 too above MAX_ATOMS distinct atoms (see the module docstring)."""
    metadata = entry["metadata"]
    if set(_UPPER.findall(answer)) - set(metadata["variables"]):
        return 0.0
    shared, premise_programs = _premises(tuple(metadata["premises"]))
    atoms = dict(shared)
    try:
        program = _compile(answer, atoms)
    except ValueError:
        return 0.0
    columns, full = _columns(len(atoms))
    premises_true = full
    for p in premise_programs:
        premises_true &= _truth(p, columns, full)
    conclusion = _truth(program, columns, full)
    if premises_true & (conclusion ^ full):
        return 0.05  # some assignment makes every premise true and the conclusion false
    trivial = len(program) == 1 or conclusion == full
    return 0.25 if trivial else 1.0
