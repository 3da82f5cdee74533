"""The ledger (pool_rollout) becomes range-partitioned by its primary key, the group id: group ids are
UUIDv7 (sapo_node.ids), so a range of ids is a range of time, one partition per UTC month
(`pool_rollout_pYYYYMM`, from the floor id of the month's first millisecond to the next month's) and a
DEFAULT one (`pool_rollout_default`) for ids outside them: the UUIDv4 ids a pool held before, spread
over the whole range (docs/architecture.md, "The pool's storage").

Django does not make partitioned tables: the SQL is here. A filled pool moves in whole, in the
migration's transaction: a partitioned copy of the table is made (its CHECK constraints, defaults and
storage), the months from the oldest group's to 2 months ahead with it (pool.retention makes them
ahead from then on, with the same names and bounds), every row is copied by one INSERT ... SELECT, the
foreign keys that point at the ledger are dropped, the old table is dropped and the copy takes its
name; then its primary key, its indexes (partial ones included) and the foreign keys, its own and
those pointing at it, are made again with their names. Backward, the same with a plain table. The
time it takes per million groups: docs/deploy.md, "The ledger's partitions".
"""

from datetime import UTC, date, datetime

from django.db import migrations, models
from psycopg import sql

import sapo_node.ids

_TABLE = "pool_rollout"
_MOVED = "pool_rollout_moved"
AHEAD_MONTHS = 2


def _months(first: date, last: date) -> list[date]:
    months, month = [], first.replace(day=1)
    while month <= last:
        months.append(month)
        month = date(month.year + month.month // 12, month.month % 12 + 1, 1)
    return months


def _next_month(month: date) -> date:
    return date(month.year + month.month // 12, month.month % 12 + 1, 1)


def _floor(month: date) -> str:
    return str(sapo_node.ids.uuid7_floor(datetime(month.year, month.month, 1, tzinfo=UTC)))


def _rebuild(cursor, *, partitioned: bool) -> None:  # noqa: ANN001
    cursor.execute(
        "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s::regclass AND NOT indisprimary",
        [_TABLE],
    )
    # A partitioned table's indexes read "ON ONLY": made again on the parent, they reach every partition.
    indexes = [row[0].replace(" ON ONLY ", " ON ") for row in cursor.fetchall()]
    cursor.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f'",
        [_TABLE],
    )
    own = cursor.fetchall()
    cursor.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE confrelid = %s::regclass AND contype = 'f' AND conparentid = 0",
        [_TABLE],
    )
    pointing = cursor.fetchall()
    like = sql.SQL(
        "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)"
    ).format(sql.Identifier(_MOVED), sql.Identifier(_TABLE))
    if partitioned:
        cursor.execute(sql.Composed([like, sql.SQL(" PARTITION BY RANGE (id)")]))
        cursor.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF {} DEFAULT").format(
                sql.Identifier(f"{_TABLE}_default"), sql.Identifier(_MOVED)
            )
        )
        cursor.execute(sql.SQL("SELECT min(created_at) FROM {}").format(sql.Identifier(_TABLE)))
        now = datetime.now(UTC)
        oldest = cursor.fetchone()[0] or now
        last = now.date().replace(day=1)
        for _ in range(AHEAD_MONTHS):
            last = _next_month(last)
        for month in _months(oldest.astimezone(UTC).date(), last):
            cursor.execute(
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                    sql.Identifier(f"{_TABLE}_p{month:%Y%m}"),
                    sql.Identifier(_MOVED),
                    sql.Literal(_floor(month)),
                    sql.Literal(_floor(_next_month(month))),
                )
            )
    else:
        cursor.execute(like)
    cursor.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(sql.Identifier(_MOVED), sql.Identifier(_TABLE)))
    for table, name, _ in pointing:
        cursor.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(sql.Identifier(table), sql.Identifier(name)))
    cursor.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(_TABLE)))
    cursor.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(sql.Identifier(_MOVED), sql.Identifier(_TABLE)))
    cursor.execute(
        sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY (id)").format(
            sql.Identifier(_TABLE), sql.Identifier(f"{_TABLE}_pkey")
        )
    )
    for index in indexes:
        cursor.execute(index)
    for table, name, definition in [(_TABLE, name, definition) for name, definition in own] + pointing:
        cursor.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                sql.Identifier(table), sql.Identifier(name), sql.SQL(definition)
            )
        )
    cursor.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(_TABLE)))


def move_in(apps, schema_editor) -> None:  # noqa: ANN001
    with schema_editor.connection.cursor() as cursor:
        _rebuild(cursor, partitioned=True)


def move_out(apps, schema_editor) -> None:  # noqa: ANN001
    with schema_editor.connection.cursor() as cursor:
        _rebuild(cursor, partitioned=False)


class Migration(migrations.Migration):
    dependencies = [
        ("pool", "0010_rollout_review_index"),
    ]

    operations = [
        migrations.RunPython(move_in, move_out),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="rollout",
                    name="id",
                    field=models.UUIDField(
                        default=sapo_node.ids.uuid7,
                        help_text="Chosen by the node (a UUIDv7); idempotency key and partition key.",
                        primary_key=True,
                        serialize=False,
                    ),
                ),
            ]
        ),
    ]
