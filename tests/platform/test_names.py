"""Names people choose for others to read: look-alikes (UTS #39 skeletons), mixed scripts, invisible
characters and the reserved "anonymous", for display names, team names and team addresses (common.names)."""

from __future__ import annotations

import pytest
from factories import make_user
from test_community_teams import found

from accounts.models import User
from accounts.services import user_create
from common import names
from common.errors import ApplicationError
from community.models import Team
from community.services import team_edit, team_moderate

pytestmark = pytest.mark.django_db

# (name, the code it is refused with, or None when it is accepted), for team and display names alike.
NAMES = [
    ("Night Owls", None),
    ("Équipe 東京", None),  # Latin with Han: a real name, not a disguise
    ("Команда", None),  # one script
    ("\u0410lpha Team", "invalid"),  # Cyrillic А among Latin letters
    ("Te\u200bam", "invalid"),  # zero-width space
    ("Team \u202eevil", "invalid"),  # right-to-left override
    ("\u3164\u3164\u3164", "invalid"),  # Hangul filler: renders blank
    ("Owl\u115f\u1160s", "invalid"),  # Hangul choseong/jungseong fillers
    ("Owls\uffa0\uffa0", "invalid"),  # halfwidth Hangul filler
    ("\u2800\u2800\u2800", "invalid"),  # blank braille cells
    ("Team 1\u0663", "invalid"),  # digits of two numbering systems
    ("anonymous", "reserved"),
    ("ANONYMOUS", "reserved"),
    ("\u0430\u043do\u043dy\u043c\u043eus", "invalid"),  # Cyrillic look-alike, mixed with Latin
    ("аnоnуmоuѕ", "invalid"),
]


@pytest.mark.parametrize(("name", "refused"), NAMES)
def test_team_names(user, name, refused):
    if refused is None:
        assert found(user, name).name == name
        return
    with pytest.raises(ApplicationError) as exc:
        found(user, name)
    assert exc.value.code == {"invalid": "invalid_team_name", "reserved": "team_name_reserved"}[refused]
    assert exc.value.extra["field"] == "name" and "team name" in exc.value.message
    assert not Team.objects.exists()


@pytest.mark.parametrize(("name", "refused"), NAMES)
def test_display_names(name, refused):
    if refused is None:
        assert user_create(username="someone", display_name=name, password=None).display_name == name
        return
    with pytest.raises(ApplicationError) as exc:
        user_create(username="someone", display_name=name, password=None)
    assert exc.value.code == {"invalid": "invalid_display_name", "reserved": "display_name_reserved"}[refused]
    assert exc.value.extra["field"] == "display_name" and "display name" in exc.value.message
    assert not User.objects.filter(username="someone").exists()


def test_signup_form_refuses_a_display_name_with_invisible_characters(client):
    response = client.post(
        "/accounts/signup/",
        {
            "username": "mallory",
            "display_name": "Al\u200bice",
            "password1": "x-long-pass-123!",
            "password2": "x-long-pass-123!",
        },
    )
    assert response.status_code == 400 and "The display name contains invisible" in response.content.decode()
    assert not User.objects.filter(username="mallory").exists()


@pytest.mark.parametrize(
    "lookalike",
    ["alpha team", "ALPHA TEAM", "A1pha Team", "AIpha Team", "Alpha Tearn"],
)
def test_a_team_name_that_reads_as_an_existing_one_is_taken(user, lookalike):
    alpha = found(user, "Alpha Team")
    with pytest.raises(ApplicationError) as exc:
        found(make_user(), lookalike)
    assert (exc.value.code, exc.value.status) == ("team_name_taken", 409)
    other = found(make_user(), "Beta Team")
    with pytest.raises(ApplicationError) as exc:
        team_edit(actor=other.founder, team=other, name=lookalike, description="", url="")
    assert exc.value.code == "team_name_taken"
    with pytest.raises(ApplicationError) as exc:
        team_moderate(actor=make_user(is_staff=True), team=other, action="rename", name=lookalike, reason="x")
    assert exc.value.code == "team_name_taken"
    assert Team.objects.get(id=alpha.id).name == "Alpha Team"


@pytest.mark.parametrize("lookalike", ["alice", "ALICE", "AIice", "a1ice"])
def test_a_display_name_that_reads_as_an_existing_one_is_taken(lookalike):
    make_user(display_name="Alice")
    with pytest.raises(ApplicationError) as exc:
        user_create(username="mallory", display_name=lookalike, password=None)
    assert exc.value.code == "display_name_taken"


@pytest.mark.parametrize(
    ("url", "stored"),
    [
        ("https://apple.com/", "https://apple.com/"),
        ("https://\u0430pple.com/", None),  # Cyrillic а among Latin letters
        ("https://xn--pple-43d.com/", None),  # the same host, punycoded
        ("https://\u0440\u0430\u0443\u0440\u0430.com/", None),  # all Cyrillic, reads as "paypa"
        ("https://münchen.de/team", "https://xn--mnchen-3ya.de/team"),  # a real IDN: stored punycoded
        ("https://例え.jp/", "https://xn--r8jz45g.jp/"),
        ("https://owls.example.org:8443/x", "https://owls.example.org:8443/x"),
    ],
)
def test_team_addresses(user, url, stored):
    if stored is not None:
        assert found(user, url=url).url == stored
        return
    with pytest.raises(ApplicationError) as exc:
        found(user, url=url)
    assert exc.value.code == "invalid_team_url" and exc.value.extra["field"] == "url"


def test_skeletons_are_unicode_confusable_skeletons():
    assert names.skeleton("\u0410lpha") == names.skeleton("Alpha") == names.skeleton("ALPHA")
    assert names.skeleton("rn") == names.skeleton("m")
    assert names.skeleton("Night Owls") != names.skeleton("Night Owl")
