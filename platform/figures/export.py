"""The daily statistics export: one gzip file per table and format, written to SAPO_STATS_EXPORT_DIR
and served as files at /stats/ (docs/figures.md#daily-statistics-export documents the schema).

Written by the scheduled job `export` when the last export is EXPORT_EVERY old, and on demand by
`manage.py sapo_stats export`. Each file is written to a temporary name and renamed into place, and
`index.json` (generated time, each file's size and SHA-256) last, so a reader never sees half a file
or an index naming a file not yet there. Identifiers are database ids: a contributor, team or node
keeps its id for good (never reused), whatever its name becomes. Private profiles and banned
contributors and nodes are left out; a team's figures still include what they earned for it.

A contributor who turns private or is banned, and a banned node, leave the published files at once,
not at the next export: `export_withdraw` (connected to accounts.events.withdrawn) rewrites the files
without their rows. It and the export hold one lock on the folder, so an export that read the
tables before the withdrawal cannot write its rows back after it.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import gzip
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from community.models import Team
from community.selectors import badges_of_teams, badges_of_users, current_teams_of
from figures.leaderboard import contributor_figures_all, listed_node_figures
from figures.teams import team_figures_all
from swarms.scope import SITE, Scope
from swarms.selectors import swarm_list

SCHEMA_VERSION = 1
EXPORT_EVERY = timedelta(days=1)
#: How long a browser or proxy may keep a served file: a withdrawal reaches readers within this.
EXPORT_CACHE_SECONDS = 60
INDEX = "index.json"

#: Table -> its columns, in file order (CSV header, JSON keys).
COLUMNS: dict[str, list[str]] = {
    "contributors": [
        "id",
        "name",
        "page",
        "team_id",
        "verified_reward",
        "recent_credit",
        "accepted",
        "rejected",
        "helped",
        "nodes",
        "badges",
        "last_seen_at",
    ],
    "teams": [
        "id",
        "slug",
        "name",
        "page",
        "members",
        "verified_reward",
        "recent_credit",
        "accepted",
        "badges",
        "created_at",
    ],
    "nodes": [
        "id",
        "name",
        "page",
        "contributor_id",
        "verified_reward",
        "recent_credit",
        "accepted",
        "rejected",
        "helped",
        "model_id",
        "hardware",
        "last_seen_at",
    ],
    # One row per contributor (node) and swarm it has figures in: its rows add up to its row above.
    "contributor_swarms": [
        "contributor_id",
        "swarm",
        "verified_reward",
        "recent_credit",
        "accepted",
        "rejected",
        "helped",
    ],
    "node_swarms": [
        "node_id",
        "contributor_id",
        "swarm",
        "verified_reward",
        "recent_credit",
        "accepted",
        "rejected",
        "helped",
    ],
}
FILES = [f"{table}.{fmt}.gz" for table in COLUMNS for fmt in ("json", "csv")]


def export_dir() -> Path:
    return Path(settings.SAPO_STATS_EXPORT_DIR)


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _credit(figures: Any) -> dict[str, Any]:
    """The credit columns every table has (a contributor's, a team's or a node's figures)."""
    return {
        "verified_reward": round(figures.verified_reward, 6),
        "recent_credit": round(figures.recent_credit, 6),
        "accepted": figures.accepted,
    }


def _rows() -> dict[str, list[dict[str, Any]]]:
    """Every table's rows, from the figures the pages show (one computation of each)."""
    contributors = [c for c in contributor_figures_all(scope=SITE) if c.username]  # private profiles have none
    owner_ids = [c.owner_id for c in contributors]
    user_badges, teams_of = badges_of_users(owner_ids, scope=SITE), current_teams_of(owner_ids)
    public_owners = set(owner_ids)
    teams = team_figures_all(scope=SITE)
    team_badges = badges_of_teams((t.team_id for t in teams), scope=SITE)
    return {
        "contributors": [
            {
                "id": c.owner_id,
                "name": c.contributor,
                "page": f"/contributors/{c.username}/",
                "team_id": teams_of[c.owner_id].id if c.owner_id in teams_of else None,
                **_credit(c),
                "rejected": c.rejected,
                "helped": c.helped,
                "nodes": c.nodes,
                "badges": sorted(user_badges.get(c.owner_id, [])),
                "last_seen_at": _time(c.last_seen_at),
            }
            for c in sorted(contributors, key=lambda c: c.owner_id)
        ],
        "teams": [
            {
                "id": t.team_id,
                "slug": t.slug,
                "name": t.name,
                "page": f"/teams/{t.slug}/",
                "members": t.members,
                **_credit(t),
                "badges": sorted(team_badges.get(t.team_id, [])),
                "created_at": _time(t.created_at),
            }
            for t in sorted(teams, key=lambda t: t.team_id)
        ],
        "nodes": [
            {
                "id": f.node_id,
                "name": f.name,
                "page": f"/nodes/{f.node_id}/",
                "contributor_id": f.owner_id,
                **_credit(f),
                "rejected": f.rejected,
                "helped": f.helped,
                "model_id": f.model_id,
                "hardware": f.hardware,
                "last_seen_at": _time(f.last_seen_at),
            }
            for f in sorted(listed_node_figures(scope=SITE), key=lambda f: f.node_id)
            if f.owner_id in public_owners
        ],
        **_swarm_rows(public_owners),
    }


def _swarm_rows(public_owners: set[int]) -> dict[str, list[dict[str, Any]]]:
    """The per-swarm tables: each swarm's figures of the contributors and nodes of the total tables."""
    contributors, nodes = [], []
    for swarm in swarm_list():
        scope = Scope.swarm(swarm.id)
        for c in contributor_figures_all(scope=scope):
            if c.owner_id in public_owners:
                contributors.append(
                    {
                        "contributor_id": c.owner_id,
                        "swarm": swarm.slug,
                        "verified_reward": round(c.verified_reward, 6),
                        "recent_credit": round(c.recent_credit, 6),
                        "accepted": c.accepted,
                        "rejected": c.rejected,
                        "helped": c.helped,
                    }
                )
        for f in listed_node_figures(scope=scope):
            if f.owner_id in public_owners:
                nodes.append(
                    {
                        "node_id": f.node_id,
                        "contributor_id": f.owner_id,
                        "swarm": swarm.slug,
                        "verified_reward": round(f.verified_reward, 6),
                        "recent_credit": round(f.recent_credit, 6),
                        "accepted": f.accepted,
                        "rejected": f.rejected,
                        "helped": f.helped,
                    }
                )
    return {
        "contributor_swarms": sorted(contributors, key=lambda r: (r["contributor_id"], r["swarm"])),
        "node_swarms": sorted(nodes, key=lambda r: (r["node_id"], r["swarm"])),
    }


def _json_bytes(table: str, rows: list[dict[str, Any]], generated_at: datetime) -> bytes:
    body = {
        "schema": SCHEMA_VERSION,
        "table": table,
        "generated_at": generated_at.isoformat(),
        "columns": COLUMNS[table],
        "rows": rows,
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _csv_cell(value: Any) -> Any:
    if isinstance(value, list):
        return " ".join(value)
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value  # a spreadsheet would run it as a formula (names are untrusted text)
    return "" if value is None else value


def _csv_bytes(table: str, rows: list[dict[str, Any]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS[table])
    for row in rows:
        writer.writerow([_csv_cell(row[c]) for c in COLUMNS[table]])
    return out.getvalue().encode("utf-8")


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class ExportIndex:
    generated_at: datetime
    files: list[dict[str, Any]]  # name, table, format, rows, bytes, sha256


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """The folder's lock (every process on the host): one export or withdrawal at a time. Its file sits
    beside the folder, which holds the published files only."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_tables(directory: Path, tables: dict[str, list[dict[str, Any]]], generated_at: datetime) -> ExportIndex:
    files = []
    encoders: dict[str, Callable[[str, list], bytes]] = {
        "json": lambda table, rows: _json_bytes(table, rows, generated_at),
        "csv": _csv_bytes,
    }
    for table, rows in tables.items():
        for fmt, encode in encoders.items():
            name = f"{table}.{fmt}.gz"
            data = gzip.compress(encode(table, rows), mtime=int(generated_at.timestamp()))
            _write_atomic(directory / name, data)
            files.append(
                {
                    "name": name,
                    "table": table,
                    "format": fmt,
                    "rows": len(rows),
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
    index = {"schema": SCHEMA_VERSION, "generated_at": generated_at.isoformat(), "files": files}
    _write_atomic(directory / INDEX, json.dumps(index, indent=1).encode("utf-8"))
    return ExportIndex(generated_at, files)


def stats_export(*, directory: Path | None = None, now: datetime | None = None) -> ExportIndex:
    """Write every file and the index now."""
    directory = directory or export_dir()
    with _locked(directory):
        return _write_tables(directory, _rows(), now or timezone.now())


def export_withdraw(*, user_id: int | None = None, node_id: int | None = None, **_: Any) -> int:
    """Rewrite the published files without a contributor (their row, their nodes' rows, and the teams
    they found while banned: a banned founder's team is unlisted) or without a node. The receiver of
    accounts.events.withdrawn. Returns how many rows went."""
    directory = export_dir()
    if not (directory / INDEX).is_file():
        return 0
    with _locked(directory):
        last = export_index(directory)
        if last is None:
            return 0
        tables = {}
        for table in COLUMNS:
            if not (directory / f"{table}.json.gz").is_file() and table.endswith("_swarms"):
                continue  # an export written before the per-swarm tables existed
            try:
                body = json.loads(gzip.decompress((directory / f"{table}.json.gz").read_bytes()))
            except (OSError, ValueError):
                return 0  # a broken export is replaced by the next one; nothing to rewrite here
            tables[table] = body["rows"]
        before = sum(len(rows) for rows in tables.values())
        if user_id is not None:
            led = set(
                Team.objects.filter(founder_id=user_id, founder__banned_at__isnull=False).values_list("id", flat=True)
            )
            tables["contributors"] = [r for r in tables["contributors"] if r["id"] != user_id]
            tables["nodes"] = [r for r in tables["nodes"] if r["contributor_id"] != user_id]
            tables["teams"] = [r for r in tables["teams"] if r["id"] not in led]
            for table in ("contributor_swarms", "node_swarms"):
                if table in tables:
                    tables[table] = [r for r in tables[table] if r["contributor_id"] != user_id]
        if node_id is not None:
            tables["nodes"] = [r for r in tables["nodes"] if r["id"] != node_id]
            if "node_swarms" in tables:
                tables["node_swarms"] = [r for r in tables["node_swarms"] if r["node_id"] != node_id]
        gone = before - sum(len(rows) for rows in tables.values())
        if gone:
            _write_tables(directory, tables, last.generated_at)
        return gone


def export_index(directory: Path | None = None) -> ExportIndex | None:
    """The last export's index, or None when there is none (or it cannot be read)."""
    try:
        raw = json.loads(((directory or export_dir()) / INDEX).read_text("utf-8"))
        return ExportIndex(datetime.fromisoformat(raw["generated_at"]), list(raw["files"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stats_export_job() -> str:
    """The scheduled job: export when the last export is EXPORT_EVERY old (or missing)."""
    last = export_index()
    now = timezone.now()
    if last is not None and now - last.generated_at < EXPORT_EVERY:
        return f"last export at {last.generated_at:%Y-%m-%d %H:%M} UTC is fresh"
    index = stats_export(now=now)
    return "exported " + ", ".join(f"{f['name']} ({f['rows']} rows)" for f in index.files if f["format"] == "json")


def export_file(name: str) -> Path | None:
    """The path of an exported file by its public name (only the names the export writes), if present."""
    if name not in FILES and name != INDEX:
        return None
    path = export_dir() / name
    return path if path.is_file() else None
