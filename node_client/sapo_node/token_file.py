"""A node token kept in a file (SAPO_TOKEN_FILE: what `sapo-node service` writes), out of command lines
and unit files that any local user may read."""

from __future__ import annotations

from pathlib import Path


def token_from_file(path: str | Path) -> str:
    """The token in `path` (one line). Raises ValueError when it is missing, empty, or readable by others."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"SAPO_TOKEN_FILE {path}: {exc.strerror or exc}") from None
    if mode & 0o077:
        raise ValueError(f"SAPO_TOKEN_FILE {path} may be read by others (mode {mode & 0o777:o}): chmod 600 it")
    if not token:
        raise ValueError(f"SAPO_TOKEN_FILE {path} is empty")
    return token
