"""What a library's code refers to, read from its compiled code (for the patches' `moved()`)."""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)  # nested functions, comprehensions


def names_used(*functions: object) -> set[str]:
    """The global and attribute names the functions' code (nested code included) looks up."""
    found: set[str] = set()
    for function in functions:
        function = inspect.unwrap(function)
        for code in _codes(function.__code__):
            found.update(code.co_names)
    return found


def names_used_in_module(module: types.ModuleType) -> set[str]:
    """The names looked up by every function and method defined in `module` (not imported into it)."""
    functions = []
    for value in vars(module).values():
        members = vars(value).values() if isinstance(value, type) else (value,)
        for member in members:
            member = getattr(member, "__func__", member)  # classmethod, staticmethod
            if isinstance(member, property):
                member = member.fget
            if isinstance(member, types.FunctionType) and member.__module__ == module.__name__:
                functions.append(member)
    return names_used(*functions)
