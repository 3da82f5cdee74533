"""Which swarm, said one way (docs/architecture.md, "Which swarm"): the pool takes a swarm id and
nothing else, figures, presence and badges take a named Scope, and neither side reads the other's
missing value as "every swarm" or "the default swarm"."""

from __future__ import annotations

import pytest
from factories import make_node, make_swarm
from support.pool import SAPO, default_swarm, make_group, to_rollout_in

from community.selectors import badges_of_users
from figures.leaderboard import contributor_figures_all, leaderboard, listed_node_figures
from figures.swarm import swarm_overview
from figures.teams import team_detail, team_figures_all
from nodes import presence
from pool.ingest import rollout_share
from pool.ingest_statement import SwarmOfBatch
from pool.sampling import rollout_sample
from pool.services import node_round_report
from swarms.scope import SITE, Scope


def test_a_scope_is_the_site_or_one_swarm_and_nothing_else():
    assert Scope.site() is SITE and SITE.is_site and SITE.holds(1) and SITE.holds(2)
    one = Scope.swarm(3)
    assert not one.is_site and one.swarm_id == 3 and one.holds(3) and not one.holds(4)
    assert one == Scope.swarm(3) and repr(one) == "Scope.swarm(3)" and repr(SITE) == "Scope.site()"
    with pytest.raises(ValueError):
        SITE.swarm_id  # noqa: B018 (the site has no swarm id to read by mistake)
    for bad in (None, 0, -1, True, "3", 3.0):
        with pytest.raises(TypeError):
            Scope.swarm(bad)
    for bad in (None, 3, "site"):
        with pytest.raises(TypeError):
            Scope.check(bad)


@pytest.mark.django_db
@pytest.mark.usefixtures("no_cached_figures")
def test_figures_of_the_pools_default_swarm_are_that_swarms_not_the_sites():
    """The pool's default swarm (where a hello naming none lands) handed to figures gives that swarm's
    figures: 2 groups, not the site's 3; a bare None or id is refused rather than read as a scope."""
    node = make_node(name="both")
    other = make_swarm(catalogue="sapo")
    in_default = default_swarm()
    for index, swarm in ((1, in_default), (2, in_default), (3, SwarmOfBatch(other.id, other.catalogue_version))):
        rollout_share(node=node, rollouts=[to_rollout_in(make_group(index=index))], catalogue=SAPO, swarm=swarm)

    def accepted(scope: Scope) -> int:
        return sum(c.accepted for c in contributor_figures_all(scope=scope) if c.owner_id == node.owner_id)

    assert accepted(Scope.swarm(in_default.swarm_id)) == 2
    assert accepted(Scope.swarm(other.id)) == 1
    assert accepted(SITE) == 3
    for bad in (None, in_default.swarm_id):
        for figure in (contributor_figures_all, listed_node_figures, team_figures_all, swarm_overview, leaderboard):
            with pytest.raises(TypeError):
                figure(scope=bad)
        with pytest.raises(TypeError):
            team_detail(team=None, members=[], scope=bad)  # refused before the team is read
        with pytest.raises(TypeError):
            badges_of_users([node.owner_id], scope=bad)
        with pytest.raises(TypeError):
            presence.connected_node_ids(scope=bad)
        with pytest.raises(TypeError):
            presence.connected_filter(scope=bad)


@pytest.mark.django_db
def test_the_pool_takes_its_swarm_from_the_caller_and_has_no_default():
    node = make_node(name="asker")
    group = to_rollout_in(make_group(index=4))
    with pytest.raises(TypeError):
        rollout_share(node=node, rollouts=[group], catalogue=SAPO)
    with pytest.raises(TypeError):
        rollout_sample(node=node, n=1, window_seconds=60)
    with pytest.raises(TypeError):
        node_round_report(node=node, report=None)
