"""The SQL moderation contributes to the pool's INSERT statement is a checked contract (pool.seams.RecordSql):
its text names exactly the CTEs and parameters it declares, none of them the pool's own, and each
batch's values are exactly the declared parameters. A collision fails when moderation registers (at
start-up), not as a wrong row."""

from __future__ import annotations

import pytest

from moderation.hooks import MODERATION
from moderation.screening import RECORD_SQL
from pool import seams
from pool.seams import RecordContractError, RecordSql, moderation_register, record_sql_check

FLAGS = """flagged AS (
    INSERT INTO moderation_moderationflag (rollout_id, rule, created_at)
    SELECT u.id, %(flag_rule)s, %(now)s FROM unnest(%(flag_id)b::uuid[]) AS u(id)
    WHERE u.id IN (SELECT id FROM inserted)
), counted AS MATERIALIZED (
    SELECT count(*) FROM flagged
)"""


def flags_sql(ctes: str = FLAGS, names=("flagged", "counted"), params=("flag_rule", "flag_id")) -> RecordSql:
    return RecordSql(ctes=ctes, cte_names=frozenset(names), param_names=frozenset(params))


def test_a_record_declares_what_its_text_names():
    sql = flags_sql()
    assert sql.cte_names == {"flagged", "counted"} and sql.param_names == {"flag_rule", "flag_id"}
    with pytest.raises(RecordContractError, match="CTEs"):
        flags_sql(names=("flagged",))
    with pytest.raises(RecordContractError, match="parameters"):
        flags_sql(params=("flag_id",))
    with pytest.raises(RecordContractError, match="parameters"):
        flags_sql(params=("flag_rule", "flag_id", "flag_extra"))


def test_a_batch_gives_exactly_the_declared_parameters():
    sql = flags_sql()
    part = sql.part({"flag_rule": "r", "flag_id": []})
    assert part.sql is sql and dict(part.params) == {"flag_rule": "r", "flag_id": []}
    with pytest.raises(RecordContractError, match="missing \\['flag_id'\\]"):
        sql.part({"flag_rule": "r"})
    with pytest.raises(RecordContractError, match="undeclared \\['node'\\]"):
        sql.part({"flag_rule": "r", "flag_id": [], "node": 1})


@pytest.mark.parametrize(
    ("ctes", "names", "params", "clash"),
    [
        (FLAGS.replace("counted", "totals"), ("flagged", "totals"), ("flag_rule", "flag_id"), "totals"),
        (FLAGS.replace("flag_rule", "reason"), ("flagged", "counted"), ("reason", "flag_id"), "reason"),
    ],
    ids=["a CTE of the pool's", "a parameter of the pool's"],
)
def test_a_record_naming_what_the_pools_statement_uses_is_refused_at_registration(ctes, names, params, clash):
    sql = flags_sql(ctes, names, params)
    with pytest.raises(RecordContractError, match=clash):
        record_sql_check(sql)

    class Clashing(seams.NoModeration):
        record_sql = sql

    with pytest.raises(RecordContractError, match=clash):
        moderation_register(Clashing())
    assert seams.moderation() is MODERATION  # the registered moderation is still in force


def test_the_moderation_apps_record_is_declared_and_apart_from_the_pools():
    assert MODERATION.record_sql is RECORD_SQL
    record_sql_check(RECORD_SQL)
    assert {"decisions", "fingerprints", "flags", "audit", "trust_judged", "trust"} == RECORD_SQL.cte_names
    ctes, params = seams.sql_names(RECORD_SQL.ctes)
    assert ctes & seams.INSERT_CTE_NAMES == set() and params - RECORD_SQL.param_names == {"now"}
