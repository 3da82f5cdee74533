"""Small formatting helpers for the figures on the pages."""

from __future__ import annotations

from urllib.parse import urlencode

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince

from community.models import BadgeKind
from sapo_node.progress import duration

register = template.Library()


def _unsigned_zero(text: str) -> str:
    """ "-0.00" -> "0.00": a figure that rounds to zero reads as zero, whatever side it came from
    (a tiny negative reward, or IEEE's -0.0)."""
    if text[:1] in "-−" and not any(c in "123456789" for c in text):
        return text[1:]
    return text


@register.filter
def pct(value: float | None, digits: int = 0) -> str:
    """0.873 -> "87%"; None (nothing to divide) -> an em dash."""
    if value is None:
        return "—"
    return _unsigned_zero(f"{value * 100:.{int(digits)}f}%")


@register.filter
def num(value: float | int | None, digits: int = 1) -> str:
    """A figure with `digits` decimals and thin thousands separators; None -> an em dash."""
    if value is None:
        return "—"
    return _unsigned_zero(f"{value:,.{int(digits)}f}")


@register.filter
def time_left(seconds: float | None) -> str:
    """Seconds a node said it has left, as its own progress line says them: "40 s", "12 min", "1.7 h";
    None -> an em dash."""
    if seconds is None:
        return "—"
    return duration(max(0.0, float(seconds)))


@register.filter
def signed(value: float | None, digits: int = 3) -> str:
    """A difference with its sign: 0.05 -> "+0.050", -0.01 -> "−0.010", -0.0001 -> "0.000"; None -> an
    em dash."""
    if value is None:
        return "—"
    text = f"{abs(value):.{int(digits)}f}"
    if not any(c in "123456789" for c in text):
        return text  # rounds to zero: no sign to read
    return f"{'+' if value > 0 else '−'}{text}"


@register.simple_tag(takes_context=True)
def board_url(context, board, **changes) -> str:
    """The leaderboard's query string with some parameters changed (sorting resets the page); the
    page's swarm (`swarm` in the context) is kept."""
    params = {
        "view": board.view,
        "sort": board.sort,
        "order": "desc" if board.descending else "asc",
        "page": board.page.number,
    }
    if context.get("swarm") is not None:
        params["swarm"] = context["swarm"].slug
    params.update({k: v for k, v in changes.items() if v is not None})
    return "?" + urlencode(params)


@register.simple_tag(takes_context=True)
def swarm_url(context, slug: str = "") -> str:
    """This page's query string with the swarm selector set to `slug` (empty: the whole site), back on
    its first page; the other parameters (view, sort, search) are kept."""
    params = context["request"].GET.copy()
    params.pop("page", None)
    params.pop("swarm", None)
    if slug:
        params["swarm"] = slug
    return "?" + params.urlencode()


@register.simple_tag(takes_context=True)
def sort_url(context, board, key: str) -> str:
    """Sort by `key`: descending first, flipping the order when it is already the sort key."""
    order = "asc" if board.sort == key and board.descending else "desc"
    if key == "name" and board.sort != key:
        order = "asc"
    return board_url(context, board, sort=key, order=order, page=1)


@register.simple_tag
def aria_sort(board, key: str) -> str:
    if board.sort != key:
        return ""
    return mark_safe('aria-sort="descending"' if board.descending else 'aria-sort="ascending"')  # noqa: S308


@register.filter
def get_item(mapping, key):
    """`mapping|get_item:key`: a dict lookup by a variable key (None when absent)."""
    return mapping.get(key) if mapping else None


def _ago(value) -> str:
    """ "just now", "5 minutes ago", "2 days ago" (the largest unit only)."""
    if (timezone.now() - value).total_seconds() < 60:
        return "just now"
    return f"{timesince(value, depth=1)} ago"


@register.simple_tag
def seen(when) -> str:
    """`{% seen when %}`: a <time> reading "5 minutes ago" (the exact time on hover), or "never".
    A tag, not an included template: an include ends with its file's newline, which sets a space
    before the punctuation that follows it in a sentence."""
    if when is None:
        return "never"
    return format_html(
        '<time datetime="{}" title="{} UTC">{}</time>',
        when.isoformat(),
        when.strftime("%Y-%m-%d %H:%M:%S"),
        _ago(when),
    )


_BADGE_HELP = {
    "top1": "In the top 1% by recent credit",
    "top5": "In the top 5% by recent credit",
    "top25": "In the top 25% by recent credit",
    "first_group": "Shared a first group the server accepted",
    "groups_1k": "1,000 accepted groups",
    "groups_10k": "10,000 accepted groups",
    "first_helped": "A node of another contributor trained on one of its groups",
}


@register.filter
def badge_label(kind: str) -> str:
    try:
        return BadgeKind(kind).label
    except ValueError:
        return kind


@register.filter
def badge_help(kind: str) -> str:
    return _BADGE_HELP.get(kind, "")


@register.filter
def inline_code(text: str | None) -> str:
    """Text written by the site's operators (a swarm's description, from settings or the staff form)
    as a person reads it: HTML escaped, `backticked` spans set as code rather than shown with their
    backticks, line breaks kept. Nothing else of Markdown is read."""
    if not text:
        return ""
    parts = str(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: the last one is literal
        parts[-2:] = ["`".join(parts[-2:])]
    html = []
    for index, part in enumerate(parts):
        if index % 2:
            html.append(format_html("<code>{}</code>", part))
        else:
            html.append(format_html("{}", part).replace("\n", "<br>"))
    return mark_safe("".join(html))  # noqa: S308 (every part escaped above)
