"""Teams: the services' rules (one team at a time, founder's rights, limits, untrusted text, staff
moderation in the audit log)."""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone
from factories import make_user

from common.errors import ApplicationError, NotFound
from community import selectors
from community.models import Membership, Team
from community.services import (
    team_disband,
    team_edit,
    team_found,
    team_hand_over,
    team_join,
    team_leave,
    team_moderate,
)
from moderation.models import AuditEntry, ModerationRule
from moderation.rules import rules_forget

pytestmark = pytest.mark.django_db


def _address() -> str:
    """An address of its own per call: the per-address counters outlive a test (Redis)."""
    n = uuid.uuid4().int
    return f"10.{n % 250}.{n // 250 % 250}.{n // 62500 % 250}"


def found(user, name: str = "Night Owls", **kwargs) -> Team:
    return team_found(founder=user, name=name, address=kwargs.pop("address", _address()), **kwargs)


def _code(exc_info) -> str:
    return exc_info.value.code


def test_founding_makes_the_founder_its_first_member(user):
    team = found(user, description="  We run   at night. ", url="https://owls.example.org/")
    assert (team.slug, team.description, team.founder_id) == ("night-owls", "We run at night.", user.id)
    assert [m.user_id for m in selectors.team_members(team=team)] == [user.id]
    with pytest.raises(ApplicationError) as exc:
        found(user, "Second Team")
    assert _code(exc) == "already_in_team"


def test_one_team_at_a_time_and_leaving_keeps_the_period(user, other_user):
    owls = found(user)
    larks = found(make_user(), "Early Larks")
    team_join(user=other_user, team=owls)
    assert team_join(user=other_user, team=owls).team_id == owls.id  # joining again changes nothing
    with pytest.raises(ApplicationError) as exc:
        team_join(user=other_user, team=larks)
    assert _code(exc) == "already_in_team"
    left = team_leave(user=other_user)
    assert left.left_at is not None
    team_join(user=other_user, team=larks)
    periods = Membership.objects.filter(user=other_user).order_by("joined_at")
    assert [(m.team_id, m.left_at is None) for m in periods] == [(owls.id, False), (larks.id, True)]
    with pytest.raises(ApplicationError) as exc:
        team_leave(user=make_user())
    assert _code(exc) == "not_in_team"


def test_the_founder_hands_over_before_leaving(user, other_user):
    team = found(user)
    with pytest.raises(ApplicationError) as exc:
        team_leave(user=user)
    assert _code(exc) == "founder_must_hand_over"
    with pytest.raises(ApplicationError) as exc:
        team_hand_over(actor=user, team=team, to_user_id=other_user.id)
    assert _code(exc) == "not_a_member"
    team_join(user=other_user, team=team)
    with pytest.raises(ApplicationError) as exc:
        team_hand_over(actor=other_user, team=team, to_user_id=user.id)
    assert (_code(exc), exc.value.status) == ("not_founder", 403)
    team_hand_over(actor=user, team=team, to_user_id=other_user.id)
    team_leave(user=user)
    team.refresh_from_db()
    assert team.founder_id == other_user.id


def test_only_the_founder_edits_and_names_stay_unique(user, other_user):
    team = found(user)
    found(other_user, "Early Larks")
    with pytest.raises(ApplicationError) as exc:
        team_edit(actor=other_user, team=team, name="Owls", description="", url="")
    assert _code(exc) == "not_founder"
    with pytest.raises(ApplicationError) as exc:
        team_edit(actor=user, team=team, name="early larks", description="", url="")
    assert _code(exc) == "team_name_taken"
    team_edit(actor=user, team=team, name="Owls", description="Hoot", url="")
    team.refresh_from_db()
    assert (team.name, team.slug, team.description) == ("Owls", "night-owls", "Hoot")


def test_disbanding_ends_every_membership_and_frees_the_name_not_the_slug(user, other_user):
    team = found(user)
    team_join(user=other_user, team=team)
    team_disband(actor=user, team=team)
    assert not Membership.objects.filter(team=team, left_at__isnull=True).exists()
    with pytest.raises(NotFound):
        selectors.team_get(slug=team.slug)
    again = found(other_user, "Night Owls")
    assert again.slug == "night-owls-2"
    with pytest.raises(NotFound):
        team_join(user=make_user(), team=team)


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("ab", "invalid_team_name"),
        ("x" * 41, "invalid_team_name"),
        ("<script>alert(1)</script>", "invalid_team_name"),
        ("Owls\u202egnp.exe", "invalid_team_name"),  # a right-to-left override disguises the name
        ("Zero\u200bWidth", "invalid_team_name"),
        ("-dash first", "invalid_team_name"),
    ],
)
def test_bad_names_are_refused_and_cost_nothing(user, name, code, settings):
    settings.SAPO_TEAMS_PER_ACCOUNT_PER_MONTH = 1
    with pytest.raises(ApplicationError) as exc:
        found(user, name)
    assert _code(exc) == code
    found(user, "Équipe Zürich 2")  # letters of any script; the failed try used no founding


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://team.example.org/join?x=1", True),
        ("javascript:alert(1)", False),
        ("https://user:pass@example.org/", False),
        ("ftp://example.org/", False),
        ("https://example.org/" + "a" * 200, False),
    ],
)
def test_team_addresses_are_http_links_only(user, url, ok):
    if ok:
        assert found(user, url=url).url == url
    else:
        with pytest.raises(ApplicationError) as exc:
            found(user, url=url)
        assert _code(exc) == "invalid_team_url"


def test_the_moderation_blocklist_applies_to_names_and_descriptions(user):
    ModerationRule.objects.create(key="blocklist", enabled=True, action="hold", params={"patterns": [r"\bspam+\b"]})
    rules_forget()
    try:
        for kwargs in ({"name": "Spam Kings"}, {"name": "Fine Team", "description": "we SPAMM the pool"}):
            with pytest.raises(ApplicationError) as exc:
                found(user, **kwargs)
            assert _code(exc) == "text_blocked"
        found(user, "Fine Team", description="we share good groups")
    finally:
        ModerationRule.objects.filter(key="blocklist").delete()
        rules_forget()


def test_founding_limits_per_account_and_per_address(settings):
    settings.SAPO_TEAMS_PER_ACCOUNT_PER_MONTH = 2
    settings.SAPO_TEAMS_PER_ADDRESS_PER_DAY = 3
    founder = make_user()
    for name in ("Team One", "Team Two"):
        team_disband(actor=founder, team=found(founder, name))
    with pytest.raises(ApplicationError) as exc:
        found(founder, "Team Three")
    assert (_code(exc), exc.value.status) == ("too_many_teams", 429)

    address = _address()
    for i in range(3):
        found(make_user(), f"Shared Net {i}", address=address)
    with pytest.raises(ApplicationError) as exc:
        found(make_user(), "Shared Net 3", address=address)
    assert _code(exc) == "rate_limited"


def test_banned_contributors_neither_found_nor_join(user):
    team = found(user)
    banned = make_user(banned_at=timezone.now())
    for call in (lambda: found(banned, "Banned Team"), lambda: team_join(user=banned, team=team)):
        with pytest.raises(ApplicationError) as exc:
            call()
        assert _code(exc) == "banned"


def test_staff_rename_and_hide_are_audited(user, other_user):
    team = found(user)
    staff = make_user(is_staff=True)
    with pytest.raises(ApplicationError) as exc:
        team_moderate(actor=other_user, team=team, action="hide", reason="x")
    assert _code(exc) == "forbidden"
    with pytest.raises(ApplicationError) as exc:
        team_moderate(actor=staff, team=team, action="hide", reason=" ")
    assert _code(exc) == "reason_required"
    team_moderate(actor=staff, team=team, action="rename", name="Renamed Team", reason="offensive name")
    team_moderate(actor=staff, team=team, action="hide", reason="spam team")
    entries = list(AuditEntry.objects.filter(target_type="team", target_id=str(team.id)).order_by("id"))
    assert [(e.action, e.actor_id, e.reason) for e in entries] == [
        ("team_rename", staff.id, "offensive name"),
        ("team_hide", staff.id, "spam team"),
    ]
    assert entries[0].details == {"name": "Night Owls", "new_name": "Renamed Team", "name_locked": True}
    # Hidden: off the lists, not found by others, not joinable; its members and staff still see it.
    assert not selectors.team_list().filter(id=team.id).exists()
    with pytest.raises(NotFound):
        selectors.team_get(slug=team.slug, viewer=other_user)
    with pytest.raises(NotFound):
        team_join(user=other_user, team=team)
    assert selectors.team_get(slug=team.slug, viewer=user) == team
    assert selectors.team_get(slug=team.slug, viewer=staff) == team
    team_moderate(actor=staff, team=team, action="show", reason="cleaned up")
    assert selectors.team_list().filter(id=team.id).exists()


def test_staff_find_every_team_in_the_admin_read_only(client, user):
    team = found(user)
    team_moderate(actor=make_user(is_staff=True), team=team, action="hide", reason="spam")
    admin = make_user(is_staff=True, is_superuser=True)
    client.force_login(admin)
    page = client.get("/admin/community/team/").content.decode()
    assert "Night Owls" in page and f'href="/teams/{team.slug}/"' in page
    assert client.get(f"/admin/community/team/{team.id}/change/").status_code == 200  # a view, no form to save
    assert client.post(f"/admin/community/team/{team.id}/change/", {"name": "x"}).status_code == 403
