"""The texts' partitions and their retention (docs/architecture.md, "The pool's storage"; the archive's
schema in docs/deploy.md, "Text retention and archives").

`pool_rollouttext` has one partition per UTC day (`pool_rollouttext_pYYYYMMDD`) and a DEFAULT one. The
scheduled job `retention` makes the days ahead (`partitions_ensure`) and ages out the days past the
retention (`texts_age_out`): for each, oldest first, it writes the day's texts to the archive folder
and syncs the file and the folder to disk, then, in one transaction, detaches the day's partition, puts
the texts of groups under review back (the DEFAULT partition takes them) and drops the rest. A run
stopped anywhere leaves the day whole or gone; the next run does it again from the start. A day whose
archive cannot be written is not dropped: the run stops there and the error is kept (RetentionDay.error)
for /readyz. Without an archive folder, texts are dropped only when the operator allows it
(SAPO_RETENTION_UNARCHIVED=drop); otherwise the days past the retention stay (`retention_plan` says
which).

The ledger (`pool_rollout`) is range-partitioned by group id, one partition per UTC month of UUIDv7 ids
(`pool_rollout_pYYYYMM`) and a DEFAULT one: the job makes the months ahead too (`ledger_partitions_ensure`)
and never drops one (the ledger is kept for good; docs/deploy.md, "The ledger's partitions", says how an
operator detaches and archives an old month).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone
from psycopg import sql

from pool.group_columns import CLAIMED_REWARDS, GROUP_COLUMNS, VERIFIED_REWARDS
from pool.limits import current_limits
from pool.models import ModerationStatus, RetentionDay
from sapo_node.ids import uuid7_floor

log = logging.getLogger(__name__)

PARENT = "pool_rollouttext"
DEFAULT_PARTITION = "pool_rollouttext_default"
_PARENT = sql.Identifier(PARENT)
_DEFAULT = sql.Identifier(DEFAULT_PARTITION)
#: Days made ahead of today by each run.
AHEAD_DAYS = 7
#: Moderation statuses whose groups keep their texts past the retention (a moderator may still look);
#: pool_rollout_review_idx is partial on them.
UNDER_REVIEW = (ModerationStatus.HELD, ModerationStatus.QUARANTINED)
#: Rows read from the database per round trip while archiving a day.
ARCHIVE_CHUNK = 2_000
#: pg advisory lock id of a retention run: two runs at once (two schedulers) do not race on one day.
_LOCK_KEY = 0x5A90_7E7E

_NAME = re.compile(r"^pool_rollouttext_p(\d{8})$")


class ArchiveError(OSError):
    """A day's archive file could not be written: the day is not dropped."""


def partition_name(day: date) -> str:
    return f"{PARENT}_p{day:%Y%m%d}"


def _bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def _partition_names(parent: str) -> list[str]:
    """The names of `parent`'s partitions."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass",
            [parent],
        )
        return [row[0] for row in cursor.fetchall()]


def day_partitions() -> dict[date, str]:
    """The day partitions that exist, by day."""
    names = _partition_names(PARENT)
    return {datetime.strptime(m.group(1), "%Y%m%d").date(): name for name in names if (m := _NAME.match(name))}


def partitions_ensure(*, now: datetime | None = None, ahead: int = AHEAD_DAYS) -> list[str]:
    """Make the day partitions from today to `ahead` days on that do not exist, and those of days the
    DEFAULT partition has rows of (the job did not run ahead of them) that were not aged out; return
    their names. The DEFAULT partition's rows of a day move into its new partition in the same
    transaction (PostgreSQL refuses to attach a range the DEFAULT partition holds rows of)."""
    today = (now or timezone.now()).astimezone(UTC).date()
    existing = day_partitions()
    dropped = set(RetentionDay.objects.filter(dropped_at__isnull=False).values_list("day", flat=True))
    with connection.cursor() as cursor:  # small: groups kept under review, and days the job was late for
        cursor.execute(sql.SQL("SELECT DISTINCT (created_at AT TIME ZONE 'UTC')::date FROM {}").format(_DEFAULT))
        late = {row[0] for row in cursor.fetchall()} - dropped
    made = []
    for day in sorted(late | {today + timedelta(days=offset) for offset in range(ahead + 1)}):
        if day in existing:
            continue
        name = partition_name(day)
        table = sql.Identifier(name)
        lo, hi = _bounds(day)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                sql.SQL(
                    "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
                    " INCLUDING STORAGE INCLUDING COMPRESSION)"
                ).format(table, _PARENT)
            )
            cursor.execute(
                sql.SQL(
                    "WITH moved AS (DELETE FROM {} WHERE created_at >= {} AND created_at < {} RETURNING *)"
                    " INSERT INTO {} SELECT * FROM moved"
                ).format(_DEFAULT, sql.Placeholder("lo"), sql.Placeholder("hi"), table),
                {"lo": lo, "hi": hi},
            )
            cursor.execute(  # DDL takes no parameters: the bounds as literals
                sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
                    _PARENT, table, sql.Literal(lo.isoformat()), sql.Literal(hi.isoformat())
                )
            )
        made.append(name)
    return made


LEDGER = "pool_rollout"
LEDGER_DEFAULT = "pool_rollout_default"
#: Months made ahead of this one by each run.
AHEAD_MONTHS = 2
_LEDGER_NAME = re.compile(r"^pool_rollout_p(\d{6})$")


def ledger_partition_name(month: date) -> str:
    return f"{LEDGER}_p{month:%Y%m}"


def _next_month(month: date) -> date:
    return date(month.year + month.month // 12, month.month % 12 + 1, 1)


def ledger_bounds(month: date) -> tuple[str, str]:
    """A month's range of ids: the floor UUIDv7 of its first millisecond to the next month's."""
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    end = _next_month(month)
    return str(uuid7_floor(start)), str(uuid7_floor(datetime(end.year, end.month, 1, tzinfo=UTC)))


def ledger_partitions() -> dict[date, str]:
    """The ledger's month partitions that exist, by the month's first day."""
    names = _partition_names(LEDGER)
    return {
        datetime.strptime(m.group(1) + "01", "%Y%m%d").date(): name for name in names if (m := _LEDGER_NAME.match(name))
    }


def ledger_partitions_ensure(
    *, now: datetime | None = None, ahead: int = AHEAD_MONTHS, since: date | None = None
) -> list[str]:
    """Make the ledger's month partitions from this month (or `since`'s, when earlier: a pool filled
    with older ids) to `ahead` months on that do not exist; return their names. The DEFAULT partition's
    rows in a new month's range move into it in the same transaction (found by the primary key's
    range; PostgreSQL refuses to attach a range the DEFAULT partition holds rows of, and checks that
    with a scan of it: one per month made)."""
    month = (now or timezone.now()).astimezone(UTC).date().replace(day=1)
    first = min(month, since.replace(day=1)) if since else month
    last = month
    for _ in range(ahead):
        last = _next_month(last)
    existing = ledger_partitions()
    made = []
    while first <= last:
        if first not in existing:
            name = ledger_partition_name(first)
            lo, hi = ledger_bounds(first)
            _ledger_month_make(name, lo, hi)
            made.append(name)
        first = _next_month(first)
    return made


def _ledger_month_make(name: str, lo: str, hi: str) -> None:
    """Make the month partition `name` for ids in [lo, hi), in one transaction. The DEFAULT partition's
    rows in the range move into it first. A foreign key to a partitioned table binds each referencing
    row to the partition holding its group, so the rows pointing at the moving groups (consumptions,
    served groups, moderation's: whatever has a foreign key to the ledger) are taken out and put back
    around the move, as they were. Normally the range is empty (the month is made ahead) and all of it
    is index lookups that find nothing."""
    table, parent, default = sql.Identifier(name), sql.Identifier(LEDGER), sql.Identifier(LEDGER_DEFAULT)
    bounds = {"lo": lo, "hi": hi}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            sql.SQL(
                "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
                " INCLUDING STORAGE INCLUDING COMPRESSION)"
            ).format(table, parent)
        )
        cursor.execute(
            "SELECT c.conrelid::regclass::text, a.attname FROM pg_constraint c"
            " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]"
            " WHERE c.confrelid = %s::regclass AND c.contype = 'f' AND c.conparentid = 0 ORDER BY 1, 2",
            [LEDGER],
        )
        held = []
        for k, (referencing, column) in enumerate(cursor.fetchall()):
            temporary = sql.Identifier(f"ledger_month_references_{k}")
            cursor.execute(
                sql.SQL(
                    "CREATE TEMPORARY TABLE {temporary} AS"
                    " WITH gone AS (DELETE FROM {referencing} WHERE {column} >= {lo} AND {column} < {hi}"
                    " AND {column} IN (SELECT id FROM {default} WHERE id >= {lo} AND id < {hi}) RETURNING *)"
                    " SELECT * FROM gone"
                ).format(
                    temporary=temporary,
                    referencing=sql.Identifier(referencing),
                    column=sql.Identifier(column),
                    default=default,
                    lo=sql.Literal(lo),  # CREATE TABLE AS takes no parameters
                    hi=sql.Literal(hi),
                )
            )
            held.append((referencing, temporary))
        cursor.execute(
            sql.SQL(
                "WITH moved AS (DELETE FROM {} WHERE id >= {} AND id < {} RETURNING *) INSERT INTO {} SELECT * FROM moved"
            ).format(default, sql.Placeholder("lo"), sql.Placeholder("hi"), table),
            bounds,
        )
        if held:
            # The checks the deletions queued (deferred keys) run now, while nothing points at the moved
            # groups: at commit, they would find the references put back and no group in the DEFAULT.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        cursor.execute(  # DDL takes no parameters: the bounds as literals
            sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
                parent, table, sql.Literal(lo), sql.Literal(hi)
            )
        )
        for referencing, temporary in held:
            cursor.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(sql.Identifier(referencing), temporary))
            cursor.execute(sql.SQL("DROP TABLE {}").format(temporary))


def longest_window() -> timedelta:
    """The longest sampling window in force: the site's, or a swarm's own if longer."""
    from swarms.models import Swarm

    site = current_limits().sample_window_seconds
    swarms = Swarm.objects.aggregate(longest=Max("sample_window_seconds"))["longest"] or 0
    return timedelta(seconds=max(site, swarms))


def texts_kept_since(now: datetime | None = None) -> datetime:
    """Texts created at or after this are kept: the retention, and never less than the longest
    sampling window and a day (a swarm's window may be set longer than the retention)."""
    now = now or timezone.now()
    keep = max(timedelta(days=settings.SAPO_TEXT_RETENTION_DAYS), longest_window() + timedelta(days=1))
    return now - keep


def archive_path(directory: Path, day: date) -> Path:
    return directory / f"pool-texts-{day:%Y-%m-%d}.jsonl.gz"


#: The archive's keys (docs/deploy.md, "Archive files") and the column each is read from: a group's
#: fields where the pool stores them (pool.group_columns, its rewards as claimed and as verified), and
#: what the pool adds. The id is the texts' own: a text is archived whether or not its ledger row joins.
_ARCHIVE_COLUMNS = {
    "id": ("t", "rollout_id"),
    "swarm_id": ("t", "swarm_id"),
    "created_at": ("t", "created_at"),
    "node_id": ("r", "node_id"),
    **{name: column for name, column in GROUP_COLUMNS.items() if name not in ("id", "rewards")},
    "verdict": ("r", "verdict"),
    "reason": ("r", "reason"),
    "moderation_status": ("r", "moderation_status"),
    "claimed_rewards": CLAIMED_REWARDS,
    "verified_rewards": VERIFIED_REWARDS,
}
_ARCHIVE_KEYS = tuple(_ARCHIVE_COLUMNS)
_ARCHIVE_SQL = sql.SQL("""
SELECT {columns}
FROM {partition} t LEFT JOIN pool_rollout r ON r.id = t.rollout_id
ORDER BY t.created_at, t.rollout_id
""")
_ARCHIVE_SELECTED = sql.SQL(", ").join(sql.Identifier(table, column) for table, column in _ARCHIVE_COLUMNS.values())


def _fsync_folder(folder: Path) -> None:
    """Sync a folder's entries (a rename or a new file in it) to disk: the file's own fsync does not."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _folder_make(directory: Path) -> None:
    """Make the archive folder and its missing parents, each one's entry synced in its parent."""
    missing, folder = [], directory
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    directory.mkdir(parents=True, exist_ok=True)
    for folder in reversed(missing):
        _fsync_folder(folder.parent)


def _archive_day(day: date, name: str, directory: Path) -> tuple[Path, int]:
    """Write the day's texts (with their ledger columns) to its archive file: a temporary name, synced
    to disk whole (the gzip trailer included), renamed into place, then the folder synced, so a file
    under the final name is always whole and is still there after a power cut once this returns (the
    day is dropped after). Returns the path and the number of rows. Raises ArchiveError when the folder
    or the file cannot be written."""
    path = archive_path(directory, day)
    partial = path.with_name(path.name + ".partial")
    rows = 0
    try:
        _folder_make(directory)
        with open(partial, "wb") as raw:
            with (
                gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out,
                transaction.atomic(),
                connection.chunked_cursor() as cursor,
            ):
                cursor.execute(_ARCHIVE_SQL.format(columns=_ARCHIVE_SELECTED, partition=sql.Identifier(name)))
                while chunk := cursor.fetchmany(ARCHIVE_CHUNK):
                    for row in chunk:
                        record = dict(zip(_ARCHIVE_KEYS, row, strict=True))
                        record["id"] = str(record["id"])
                        record["created_at"] = record["created_at"].astimezone(UTC).isoformat()
                        for key in ("claimed_rewards", "verified_rewards", "completions"):
                            if isinstance(record[key], str):
                                record[key] = json.loads(record[key])
                        out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
                        rows += 1
            # The gzip file is closed (its last block and trailer written) before the sync.
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, path)
        _fsync_folder(directory)
    except OSError as exc:
        try:
            partial.unlink(missing_ok=True)
        except OSError:
            pass
        raise ArchiveError(f"cannot write the archive of {day}: {exc}") from exc
    return path, rows


def _detach(cursor, name: str) -> None:  # noqa: ANN001
    cursor.execute(sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(_PARENT, sql.Identifier(name)))


def _keep_under_review(cursor, name: str, day: date) -> int:  # noqa: ANN001
    """Put the detached day's texts of groups under review back into the parent (the DEFAULT
    partition takes them: no day partition covers that day any more). Driven by the ledger's partial
    index of groups under review, not by a read of the day: the parent stays locked meanwhile."""
    lo, hi = _bounds(day)
    cursor.execute(
        sql.SQL(
            "INSERT INTO {} SELECT t.* FROM pool_rollout r JOIN {} t"
            " ON t.rollout_id = r.id AND t.created_at = r.created_at"
            " WHERE r.moderation_status IN ('held', 'quarantined') AND r.created_at >= {} AND r.created_at < {}"
        ).format(_PARENT, sql.Identifier(name), sql.Placeholder("lo"), sql.Placeholder("hi")),
        {"lo": lo, "hi": hi},
    )
    return cursor.rowcount


def _drop(cursor, name: str) -> None:  # noqa: ANN001
    cursor.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))


def _day_drop(day: date, name: str, archive: Path | None, rows: int | None, now: datetime) -> RetentionDay:
    """Detach, keep what is under review, drop, and record it: one transaction, so a failure at any
    step leaves the day's partition attached and whole."""
    with transaction.atomic(), connection.cursor() as cursor:
        if rows is None:
            cursor.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name)))
            rows = cursor.fetchone()[0]
        _detach(cursor, name)
        kept = _keep_under_review(cursor, name, day)
        _drop(cursor, name)
        record, _ = RetentionDay.objects.update_or_create(
            day=day,
            defaults={
                "groups": rows,
                "kept": kept,
                "archive": str(archive or ""),
                "dropped_at": now,
                "error": "",
            },
        )
    return record


@dataclass(frozen=True)
class AgeOutResult:
    dropped: list[RetentionDay]
    failed: RetentionDay | None
    #: Days past the retention kept whole: no archive folder, and dropping unarchived texts not allowed.
    kept_unarchived: list[date]


def retention_plan(*, directory: Path | str | None = None, unarchived: str | None = None) -> str:
    """What the retention does with texts past it, in the operator's words (the job's result line and
    `manage.py check` start with it). Arguments default to the settings, as in `texts_age_out`."""
    directory = settings.SAPO_ARCHIVE_DIR if directory is None else directory
    unarchived = unarchived or settings.SAPO_RETENTION_UNARCHIVED
    if directory:
        return f"Texts past the retention are archived to {directory}, then dropped"
    if unarchived == "drop":
        return (
            "Texts past the retention are dropped without an archive (SAPO_ARCHIVE_DIR empty,"
            " SAPO_RETENTION_UNARCHIVED=drop)"
        )
    return (
        "Texts past the retention are kept: no archive folder (SAPO_ARCHIVE_DIR empty) and dropping them"
        " unarchived is not allowed (SAPO_RETENTION_UNARCHIVED=keep)"
    )


def texts_age_out(
    *, now: datetime | None = None, directory: Path | str | None = None, unarchived: str | None = None
) -> AgeOutResult:
    """Age out every day partition whose whole day is older than `texts_kept_since`, oldest first.
    `directory`: the archive folder (default settings.SAPO_ARCHIVE_DIR; empty: no archive);
    `unarchived`: "drop" lets days go without an archive folder, "keep" keeps them whole (default
    settings.SAPO_RETENTION_UNARCHIVED). Stops at the first day whose archive cannot be written,
    recording the error on that day."""
    now = now or timezone.now()
    directory = settings.SAPO_ARCHIVE_DIR if directory is None else directory
    unarchived = unarchived or settings.SAPO_RETENTION_UNARCHIVED
    if unarchived not in ("keep", "drop"):
        raise ValueError(f"unarchived must be keep or drop, got {unarchived!r}")
    folder = Path(directory) if directory else None
    kept_since = texts_kept_since(now)
    dropped, kept_unarchived = [], []
    for day, name in sorted(day_partitions().items()):
        if _bounds(day)[1] > kept_since:
            break
        if folder is None and unarchived == "keep":
            kept_unarchived.append(day)
            continue
        archive, rows = None, None
        if folder is not None:
            try:
                archive, rows = _archive_day(day, name, folder)
            except ArchiveError as exc:
                log.error("retention stopped: %s", exc)
                failed, _ = RetentionDay.objects.update_or_create(day=day, defaults={"error": str(exc)[:2000]})
                return AgeOutResult(dropped, failed, kept_unarchived)
        dropped.append(_day_drop(day, name, archive, rows, now))
    _reviewed_drop(kept_since, unarchived=unarchived == "drop")
    return AgeOutResult(dropped, None, kept_unarchived)


def _reviewed_drop(kept_since: datetime, *, unarchived: bool) -> int:
    """Delete the texts kept past their day for review whose review is over: archived with their day,
    or, when `unarchived` (dropping unarchived texts allowed), of a day dropped without an archive. A
    DELETE, but of the DEFAULT partition's few rows only."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            sql.SQL(
                "DELETE FROM {} t USING pool_rollout r, pool_retentionday d"
                " WHERE r.id = t.rollout_id AND t.created_at < {} AND r.moderation_status <> ALL({})"
                " AND d.day = (t.created_at AT TIME ZONE 'UTC')::date AND d.dropped_at IS NOT NULL"
                " AND (d.archive <> '' OR {})"
            ).format(_DEFAULT, sql.Placeholder("since"), sql.Placeholder("review"), sql.Placeholder("unarchived")),
            {"since": kept_since, "review": list(UNDER_REVIEW), "unarchived": unarchived},
        )
        return cursor.rowcount


def retention_errors() -> list[RetentionDay]:
    """Days the retention stopped at, not dropped since (for /readyz)."""
    return list(RetentionDay.objects.exclude(error="").filter(dropped_at__isnull=True).order_by("day"))


def retention_job() -> str:
    """The scheduled job: make the days ahead, then age out the old ones, one run at a time (a session
    advisory lock; a second run at once returns at once). Raises when a day's archive could not be
    written (the job is then reported failed), after making the days ahead."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_LOCK_KEY])
        if not cursor.fetchone()[0]:
            return "another retention run holds the lock: nothing done"
    try:
        made = partitions_ensure()
        months = ledger_partitions_ensure()
        result = texts_age_out()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_LOCK_KEY])
    line = (
        f"{retention_plan()}: {len(made)} day partitions made, {len(months)} ledger months made,"
        f" {len(result.dropped)} days aged out"
        + "".join(f" ({r.day}: {r.groups} groups, {r.kept} kept under review)" for r in result.dropped)
    )
    if kept := result.kept_unarchived:
        line += f"; {len(kept)} days past the retention kept unarchived ({kept[0]} to {kept[-1]})"
    if result.failed is not None:
        raise ArchiveError(f"{line}; stopped at {result.failed.day}: {result.failed.error}")
    return line
