"""The SQL moderation contributes to the pool's INSERT statement is a checked contract (pool.seams.RecordSql):
its composed CTEs take exactly the parameters it declares, none of them the pool's own, and each
batch's values are exactly the declared parameters. A collision fails when moderation registers (at
start-up), not as a wrong row."""

from __future__ import annotations

import pytest
from psycopg import sql

from common.composed import placeholder_names, placeholders
from moderation.hooks import MODERATION
from moderation.screening import RECORD_SQL
from pool import seams
from pool.seams import RecordContractError, RecordSql, moderation_register, record_sql_check

_P = placeholders("flag_rule", "now", binary=("flag_id",))
FLAGS = {
    "flagged": sql.SQL("""
    INSERT INTO moderation_moderationflag (rollout_id, rule, created_at)
    SELECT u.id, {flag_rule}, {now} FROM unnest({flag_id}::uuid[]) AS u(id)
    WHERE u.id IN (SELECT id FROM inserted)
""").format(**_P),
    "counted": sql.SQL("SELECT count(*) FROM flagged"),
}


def flags_sql(ctes=None, params=("flag_rule", "flag_id")) -> RecordSql:
    return RecordSql(ctes=FLAGS if ctes is None else ctes, param_names=frozenset(params))


def test_a_record_declares_the_parameters_its_parts_take():
    record = flags_sql()
    assert record.cte_names == {"flagged", "counted"} and record.param_names == {"flag_rule", "flag_id"}
    with pytest.raises(RecordContractError, match="parameters"):
        flags_sql(params=("flag_id",))
    with pytest.raises(RecordContractError, match="parameters"):
        flags_sql(params=("flag_rule", "flag_id", "flag_extra"))


def test_a_record_takes_parameters_only_as_placeholders():
    """A parameter written into a text part would escape the declaration: refused, as is a CTE given
    as text rather than composed."""
    with pytest.raises(RecordContractError, match="written into SQL text"):
        flags_sql({**FLAGS, "counted": sql.SQL("SELECT count(*) FROM flagged WHERE %(flag_extra)s")})
    with pytest.raises(RecordContractError, match="not a composed statement"):
        flags_sql({**FLAGS, "counted": "SELECT count(*) FROM flagged"})
    with pytest.raises(RecordContractError, match="positional"):
        flags_sql({**FLAGS, "counted": sql.SQL("SELECT {}").format(sql.Placeholder())})


def test_a_batch_gives_exactly_the_declared_parameters():
    record = flags_sql()
    part = record.part({"flag_rule": "r", "flag_id": []})
    assert part.sql is record and dict(part.params) == {"flag_rule": "r", "flag_id": []}
    with pytest.raises(RecordContractError, match="missing \\['flag_id'\\]"):
        record.part({"flag_rule": "r"})
    with pytest.raises(RecordContractError, match="undeclared \\['node'\\]"):
        record.part({"flag_rule": "r", "flag_id": [], "node": 1})


@pytest.mark.parametrize(
    ("ctes", "params", "clash"),
    [
        ({"flagged": FLAGS["flagged"], "totals": FLAGS["counted"]}, ("flag_rule", "flag_id"), "totals"),
        (
            {**FLAGS, "counted": sql.SQL("SELECT count(*) FROM flagged WHERE {}").format(sql.Placeholder("reason"))},
            ("flag_rule", "flag_id", "reason"),
            "reason",
        ),
    ],
    ids=["a CTE of the pool's", "a parameter of the pool's"],
)
def test_a_record_naming_what_the_pools_statement_uses_is_refused_at_registration(ctes, params, clash):
    clashing = flags_sql(ctes, params)
    with pytest.raises(RecordContractError, match=clash):
        record_sql_check(clashing)

    class Clashing(seams.NoModeration):
        record_sql = clashing

    with pytest.raises(RecordContractError, match=clash):
        moderation_register(Clashing())
    assert seams.moderation() is MODERATION  # the registered moderation is still in force


def test_the_moderation_apps_record_is_declared_and_apart_from_the_pools():
    assert MODERATION.record_sql is RECORD_SQL
    record_sql_check(RECORD_SQL)
    assert {"decisions", "fingerprints", "flags", "audit", "trust_judged", "trust"} == RECORD_SQL.cte_names
    params = set().union(*map(placeholder_names, RECORD_SQL.ctes.values()))
    assert RECORD_SQL.cte_names & seams.INSERT_CTE_NAMES == set() and params - RECORD_SQL.param_names == {"now"}
