"""Team names, descriptions and addresses: untrusted text, cleaned and screened before it is stored.

The moderation app's blocklist rule applies to them as to shared groups (when staff switched it on);
control and format characters (bidirectional overrides, zero-width joiners) are refused outright, as
they serve only to disguise a name. Names are checked for look-alikes and invisible characters, and
"anonymous" is reserved (common.names); an address's host may not imitate another (common.names.host_problem)
and is stored punycoded when it is not ASCII.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from accounts.models import ANONYMOUS
from common import names
from common.errors import ApplicationError
from community.models import (
    TEAM_DESCRIPTION_MAX_LENGTH,
    TEAM_NAME_MAX_LENGTH,
    TEAM_NAME_MIN_LENGTH,
    TEAM_URL_MAX_LENGTH,
)
from moderation.filters import blocklist_finding
from moderation.rules import rules_current

# Letters and digits of any script, and a little punctuation; a name starts with a letter or digit.
_NAME_RE = re.compile(r"[^\W_][\w .,'&()+!#-]*")
_URL = URLValidator(schemes=["http", "https"])


def _has_hidden_characters(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf") for ch in text)


def _screen(texts: list[str], what: str) -> None:
    rule = rules_current().get("blocklist")
    if rule is not None and rule.enabled and blocklist_finding(texts, rule) is not None:
        raise ApplicationError("text_blocked", f"This {what} contains words the site does not allow.")


def clean_team_name(name: object) -> str:
    """Raises ApplicationError: invalid_team_name, team_name_reserved, text_blocked."""
    raw = str(name or "")
    text = " ".join(raw.split())
    if (
        _has_hidden_characters(raw.replace("\n", " ").replace("\t", " "))
        or not TEAM_NAME_MIN_LENGTH <= len(text) <= TEAM_NAME_MAX_LENGTH
        or not _NAME_RE.fullmatch(text)
    ):
        raise ApplicationError(
            "invalid_team_name",
            f"A team name has {TEAM_NAME_MIN_LENGTH}-{TEAM_NAME_MAX_LENGTH} characters: letters, digits, spaces and "
            "simple punctuation, starting with a letter or digit.",
            extra={"field": "name"},
        )
    problem = names.name_problem(text)
    if problem is not None:
        raise ApplicationError("invalid_team_name", f"The team name {problem}.", extra={"field": "name"})
    if names.looks_like(text, ANONYMOUS):
        raise ApplicationError(
            "team_name_reserved", f"The team name {ANONYMOUS!r} is reserved.", extra={"field": "name"}
        )
    _screen([text], "team name")
    return text


def clean_team_description(description: object) -> str:
    """One line of at most TEAM_DESCRIPTION_MAX_LENGTH characters. Raises ApplicationError:
    invalid_team_description, text_blocked."""
    raw = str(description or "")
    text = " ".join(raw.split())
    if _has_hidden_characters(text) or len(text) > TEAM_DESCRIPTION_MAX_LENGTH:
        raise ApplicationError(
            "invalid_team_description",
            f"A team description is one line of at most {TEAM_DESCRIPTION_MAX_LENGTH} characters, without control characters.",
        )
    if text:
        _screen([text], "description")
    return text


def clean_team_url(url: object) -> str:
    """An http(s) address without credentials, or "". The site never fetches it; pages link to it with
    rel="nofollow ugc noopener". Raises ApplicationError: invalid_team_url, text_blocked."""
    text = str(url or "").strip()
    if not text:
        return ""
    error = ApplicationError(
        "invalid_team_url", f"A team address is an http(s) URL of at most {TEAM_URL_MAX_LENGTH} characters."
    )
    if len(text) > TEAM_URL_MAX_LENGTH or _has_hidden_characters(text):
        raise error
    try:
        _URL(text)
    except ValidationError:
        raise error from None
    parts = urlsplit(text)
    if "@" in parts.netloc or not parts.hostname:
        raise error
    problem = names.host_problem(parts.hostname)
    if problem is not None:
        raise ApplicationError("invalid_team_url", f"The team address's host {problem}.", extra={"field": "url"})
    if not parts.hostname.isascii():  # shown as the browser would resolve it, never as a look-alike
        try:
            ascii_host = parts.hostname.encode("idna").decode("ascii")
        except UnicodeError:
            raise error from None
        netloc = ascii_host if parts.port is None else f"{ascii_host}:{parts.port}"
        text = parts._replace(netloc=netloc).geturl()
        if len(text) > TEAM_URL_MAX_LENGTH:
            raise error
    _screen([text], "address")
    return text
