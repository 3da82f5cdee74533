"""Teams: found, join, leave, edit, hand over, disband; staff rename and hide (audited). Privacy.

Every write runs in a transaction that locks the rows it decides on (the contributor's, the team's),
so two requests of the same person cannot put them in two teams or found past a limit.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from accounts import limits
from accounts.models import User
from common import names
from common.errors import ApplicationError, NotFound
from community.models import Membership, Team
from community.text import clean_team_description, clean_team_name, clean_team_url
from moderation.models import AuditAction, TargetType
from moderation.services import audit_staff_action

FOUNDING_WINDOW = timedelta(days=30)


def _lock_user(user: User) -> None:
    User.objects.select_for_update().filter(id=user.id).exists()


def _lock_team(team: Team) -> Team:
    """The team's row, locked, as stored now; NotFound once disbanded."""
    locked = Team.objects.select_for_update().filter(id=team.id, disbanded_at__isnull=True).first()
    if locked is None:
        raise NotFound("No such team.")
    return locked


def _ensure_not_banned(user: User) -> None:
    """From the stored row: a ban made since the request loaded `user` counts."""
    if user.banned_at is not None or User.objects.filter(id=user.id, banned_at__isnull=False).exists():
        raise ApplicationError("banned", "Your account is banned from the swarm.", status=403)


def _moves_consume(user: User) -> None:
    """Joining and leaving count against one per-account limit: each period is figures to compute."""
    limits.consume(
        "team-move",
        str(user.id),
        limit=settings.SAPO_TEAM_MOVES_PER_ACCOUNT_PER_DAY,
        window=86400,
        what="team joins and leaves today",
    )


def _ensure_name_free(name: str, team_id: int | None = None) -> None:
    """No other listed or hidden team's name reads the same (common.names: case and look-alikes)."""
    others = Team.objects.filter(names.skeleton_filter("name_skeleton", name), disbanded_at__isnull=True)
    if team_id is not None:
        others = others.exclude(id=team_id)
    if others.exists():
        raise ApplicationError(
            "team_name_taken", f"A team with a name that reads as {name!r} exists.", status=409, extra={"field": "name"}
        )


def _ensure_founder(actor: User, team: Team) -> None:
    if team.founder_id != actor.id:
        raise ApplicationError("not_founder", "Only the team's founder can do this.", status=403)


def _open_membership(user: User) -> Membership | None:
    return Membership.objects.select_related("team").filter(user=user, left_at__isnull=True).first()


def _unique_slug(name: str) -> str:
    base = slugify(name)[:48].strip("-") or "team"
    taken = set(Team.objects.filter(slug__startswith=base).values_list("slug", flat=True))
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def _save_name(team: Team, fields: list[str]) -> None:
    try:
        with transaction.atomic():
            team.save(update_fields=fields)
    except IntegrityError as exc:
        raise ApplicationError("team_name_taken", "A team with this name exists.", status=409) from exc


def team_found(*, founder: User, name: str, description: str = "", url: str = "", address: str) -> Team:
    """A contributor founds a team and becomes its first member. Limits: SAPO_TEAMS_PER_ACCOUNT_PER_MONTH
    teams founded by the account in FOUNDING_WINDOW, SAPO_TEAMS_PER_ADDRESS_PER_DAY from one address
    (`address`: accounts.limits.client_address).

    Raises ApplicationError: banned (403), invalid_team_name, team_name_reserved, invalid_team_description,
    invalid_team_url, text_blocked, already_in_team (409), too_many_teams (429), rate_limited (429),
    team_name_taken (409).
    """
    _ensure_not_banned(founder)
    name = clean_team_name(name)  # a mistyped name costs nothing against the limits
    skeleton = names.skeleton(name)
    description = clean_team_description(description)
    url = clean_team_url(url)
    with transaction.atomic():
        _lock_user(founder)
        _ensure_not_banned(founder)
        _ensure_name_free(name)
        if _open_membership(founder) is not None:
            raise ApplicationError("already_in_team", "Leave your team before founding another.", status=409)
        cap = settings.SAPO_TEAMS_PER_ACCOUNT_PER_MONTH
        if Team.objects.filter(created_by=founder, created_at__gte=timezone.now() - FOUNDING_WINDOW).count() >= cap:
            raise ApplicationError(
                "too_many_teams", f"An account founds at most {cap} teams in 30 days.", status=429, extra={"limit": cap}
            )
        limits.consume(
            "team-found-address",
            address,
            limit=settings.SAPO_TEAMS_PER_ADDRESS_PER_DAY,
            window=86400,
            what="teams founded from your network today",
        )
        team = Team(
            name=name,
            name_skeleton=skeleton,
            slug=_unique_slug(name),
            description=description,
            url=url,
            founder=founder,
            created_by=founder,
        )
        try:
            with transaction.atomic():
                team.save()
        except IntegrityError as exc:
            raise ApplicationError("team_name_taken", "A team with this name exists.", status=409) from exc
        Membership.objects.create(team=team, user=founder, joined_at=team.created_at)
    return team


def team_join(*, user: User, team: Team) -> Membership:
    """Join a listed team (already a member of it: the open membership). Credit counts from now on.

    Raises ApplicationError: banned (403), not_found (404: disbanded, hidden, or its founder banned),
    already_in_team (409), rate_limited (429: SAPO_TEAM_MOVES_PER_ACCOUNT_PER_DAY joins and leaves).
    """
    _ensure_not_banned(user)
    with transaction.atomic():
        _lock_user(user)
        team = _lock_team(team)
        if team.hidden_at is not None or User.objects.filter(id=team.founder_id, banned_at__isnull=False).exists():
            raise NotFound("No such team.")
        current = _open_membership(user)
        if current is not None:
            if current.team_id == team.id:
                return current
            raise ApplicationError(
                "already_in_team", f"You are in team {current.team.name!r}: leave it first.", status=409
            )
        _moves_consume(user)
        return Membership.objects.create(team=team, user=user)


def team_leave(*, user: User) -> Membership:
    """Leave the current team; credit earned so far stays with it.

    Raises ApplicationError: not_in_team (409), founder_must_hand_over (409), rate_limited (429:
    SAPO_TEAM_MOVES_PER_ACCOUNT_PER_DAY joins and leaves).
    """
    with transaction.atomic():
        _lock_user(user)
        current = _open_membership(user)
        if current is None:
            raise ApplicationError("not_in_team", "You are not in a team.", status=409)
        if current.team.founder_id == user.id:
            raise ApplicationError(
                "founder_must_hand_over", "You founded this team: hand it over or disband it.", status=409
            )
        _moves_consume(user)
        current.left_at = timezone.now()
        current.save(update_fields=["left_at"])
        return current


def team_membership_close(*, user: User) -> Team | None:
    """End the membership of an account being deleted (web.account), whatever the limits and bans.
    A team it founded goes to its longest-standing other member not banned, or is disbanded when it
    has none. Credit earned stays with the team. Returns the team it was in, if any."""
    with transaction.atomic():
        _lock_user(user)
        current = _open_membership(user)
        if current is None:
            return None
        now = timezone.now()
        team = _lock_team(current.team)
        current.left_at = now
        current.save(update_fields=["left_at"])
        if team.founder_id == user.id:
            heir = (
                Membership.objects.filter(team=team, left_at__isnull=True, user__banned_at__isnull=True)
                .order_by("joined_at", "id")
                .values_list("user_id", flat=True)
                .first()
            )
            if heir is not None:
                team.founder_id = heir
                team.save(update_fields=["founder"])
            else:
                Membership.objects.filter(team=team, left_at__isnull=True).update(left_at=now)
                team.disbanded_at = now
                team.save(update_fields=["disbanded_at"])
        return team


def team_edit(*, actor: User, team: Team, name: str, description: str, url: str) -> Team:
    """The founder changes the team's name, description or address (the slug stays). The name stays
    as it is once staff renamed the team, and while staff hide it.

    Raises ApplicationError: banned (403), not_found, not_founder (403), team_name_locked (403),
    team_hidden (403), invalid_team_*, team_name_reserved, text_blocked, team_name_taken (409).
    """
    _ensure_not_banned(actor)
    name, description, url = clean_team_name(name), clean_team_description(description), clean_team_url(url)
    with transaction.atomic():
        _lock_user(actor)
        _ensure_not_banned(actor)
        team = _lock_team(team)
        _ensure_founder(actor, team)
        if name != team.name:
            if team.name_locked_at is not None:
                raise ApplicationError(
                    "team_name_locked", "Staff renamed this team: its name can no longer be changed.", status=403
                )
            if team.hidden_at is not None:
                raise ApplicationError("team_hidden", "Staff hid this team: it cannot be renamed.", status=403)
            team.name_skeleton = names.skeleton(name)
            _ensure_name_free(name, team.id)
        team.name, team.description, team.url = name, description, url
        _save_name(team, ["name", "name_skeleton", "description", "url"])
    return team


def team_hand_over(*, actor: User, team: Team, to_user_id: int) -> Team:
    """The founder hands the team's rights to another current member.

    Raises ApplicationError: banned (403), not_found, not_founder (403), not_a_member (400: nor to a
    banned member).
    """
    _ensure_not_banned(actor)
    with transaction.atomic():
        _lock_user(actor)
        _ensure_not_banned(actor)
        team = _lock_team(team)
        _ensure_founder(actor, team)
        member = Membership.objects.filter(
            team=team, user_id=to_user_id, left_at__isnull=True, user__banned_at__isnull=True
        ).exclude(user=actor)
        if not member.exists():
            raise ApplicationError("not_a_member", "Hand the team over to one of its other members.")
        team.founder_id = to_user_id
        team.save(update_fields=["founder"])
    return team


def team_disband(*, actor: User, team: Team) -> Team:
    """The founder disbands the team: every membership ends now, the team leaves the lists (its slug
    is never given to another team). Raises ApplicationError: banned (403), not_found, not_founder (403)."""
    _ensure_not_banned(actor)
    with transaction.atomic():
        _lock_user(actor)
        _ensure_not_banned(actor)
        team = _lock_team(team)
        _ensure_founder(actor, team)
        now = timezone.now()
        Membership.objects.filter(team=team, left_at__isnull=True).update(left_at=now)
        team.disbanded_at = now
        team.save(update_fields=["disbanded_at"])
    return team


TEAM_MODERATION = {"rename": AuditAction.TEAM_RENAME, "hide": AuditAction.TEAM_HIDE, "show": AuditAction.TEAM_SHOW}


def team_moderate(*, actor: User, team: Team, action: str, reason: str, name: str = "") -> Team:
    """Staff rename, hide or show a team again; each action is an audit log entry with its reason.
    Staff renames pass the same name checks (the blocklist included) and lock the name: the founder
    can no longer change it (the audit entry says so).

    Raises ApplicationError: forbidden (403), invalid_action, reason_required, reason_too_long,
    not_found, invalid_team_name, text_blocked, team_name_taken (409).
    """
    if not actor.is_staff:
        raise ApplicationError("forbidden", "Only staff can moderate teams.", status=403)
    if action not in TEAM_MODERATION:
        raise ApplicationError("invalid_action", f"Unknown action {action!r}.")
    new_name = clean_team_name(name) if action == "rename" else ""
    with transaction.atomic():
        team = _lock_team(team)
        details = {"name": team.name}
        if action == "rename":
            details.update(new_name=new_name, name_locked=True)
            skeleton = names.skeleton(new_name)
            _ensure_name_free(new_name, team.id)
            team.name, team.name_skeleton, team.name_locked_at = new_name, skeleton, timezone.now()
            _save_name(team, ["name", "name_skeleton", "name_locked_at"])
        else:
            team.hidden_at = timezone.now() if action == "hide" else None
            team.save(update_fields=["hidden_at"])
        audit_staff_action(
            actor=actor,
            action=TEAM_MODERATION[action],
            target_type=TargetType.TEAM,
            target_id=team.id,
            reason=reason,
            details=details,
        )
    return team
