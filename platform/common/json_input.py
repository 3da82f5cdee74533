"""JSON that people and browsers send (an API body, a form's JSON field), parsed with its nesting
bounded: Python's parser recurses once per level, so a few thousand `[` raise RecursionError, which
no handler expects (a 500), and a value nested a few hundred deep still parses and then breaks
whatever walks it next (a validator, json.dumps when it is stored or shown). Nothing the site takes
is nested deeper than a few levels (a catalogue entry's config, a rule's parameters).
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from rest_framework import parsers
from rest_framework.exceptions import ParseError

#: Deepest nesting of arrays and objects taken (a bare scalar is depth 0, `[1]` depth 1).
MAX_JSON_DEPTH = 32


class JSONInputError(ValueError):
    """Not JSON, or nested deeper than MAX_JSON_DEPTH; the message says which."""


def json_depth_over(value: Any, max_depth: int) -> bool:
    """Whether `value` (parsed JSON) nests arrays and objects deeper than `max_depth`. Iterative: no
    recursion on the value's own depth."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth + 1 > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def json_loads_bounded(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads(text)`, refused (JSONInputError) when it is not JSON or nests deeper than `max_depth`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONInputError(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise JSONInputError(f"not JSON ({exc})") from None
    if json_depth_over(value, max_depth):
        raise JSONInputError(f"nested deeper than {max_depth} levels")
    return value


class BoundedJSONParser(parsers.JSONParser):
    """REST_FRAMEWORK's JSON parser: DRF's, with the nesting bounded (400 `parse_error`, never a 500)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        encoding = (parser_context or {}).get("encoding") or "utf-8"
        try:
            return json_loads_bounded(stream.read().decode(encoding))
        except (JSONInputError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


class BoundedJSONFormField(forms.JSONField):
    """forms.JSONField with the nesting bounded: a form error, never a 500 (the admin's JSON fields)."""

    def to_python(self, value: Any) -> Any:
        if self.disabled or value in self.empty_values or not isinstance(value, str):
            return super().to_python(value)
        try:
            json_loads_bounded(value)
        except JSONInputError as exc:
            raise forms.ValidationError(f"Enter valid JSON: {exc}.", code="invalid") from None
        return super().to_python(value)
