"""Compact JSON text for values bound into SQL (jsonb columns written in one statement)."""

from __future__ import annotations

import json

#: No spaces, non-ASCII kept as is (a completion in another script costs its UTF-8 bytes, not \u escapes).
dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
