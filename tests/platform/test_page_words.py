"""What the public pages say, as a newcomer reads it: text from settings as text (a backticked command
set as code, never shown with its backticks), plain words for I and J, a gain only with its interval,
a node's swarm on its page and on /me/'s card, and no figure that reads as negative zero."""

from __future__ import annotations

import pytest
from django.template import Context, Template
from factories import make_node, make_swarm, make_user

from pool.models import NodeRound
from swarms.models import Swarm
from swarms.services import swarm_default_ensure

pytestmark = pytest.mark.django_db


def _render(source: str, **context) -> str:
    return Template("{% load web_tags %}" + source).render(Context(context))


def test_figures_that_round_to_zero_read_as_zero():
    assert _render("{{ v|num:1 }} {{ v|num:2 }} {{ v|pct:1 }} {{ v|signed:3 }}", v=-0.0001) == "0.0 0.00 0.0% 0.000"
    assert _render("{{ v|num:1 }} {{ v|pct }} {{ v|signed }}", v=-0.0) == "0.0 0% 0.000"
    # A figure that does not round to zero keeps its sign.
    assert _render("{{ v|num:2 }} {{ v|signed:2 }}", v=-0.25) == "-0.25 −0.25"
    assert _render("{{ v|num:0 }}", v=-12345.6) == "-12,346"


def test_a_time_left_reads_in_the_unit_anyone_reads_it_in():
    assert _render(
        "{{ a|time_left }}, {{ b|time_left }}, {{ c|time_left }}, {{ d|time_left }}", a=40.2, b=600, c=6100.0, d=None
    ) == ("40 s, 10 min, 1.7 h, —")


def test_operator_text_shows_backticked_commands_as_code_and_escapes_the_rest():
    text = "The nodes `make run` starts <here>.\nSecond line, a lone ` backtick."
    html = _render("{{ t|inline_code }}", t=text)
    assert "<code>make run</code>" in html and "`make run`" not in html
    assert "&lt;here&gt;" in html and "<br>" in html and "a lone ` backtick" in html
    assert _render("{{ t|inline_code }}", t="`<script>`") == "<code>&lt;script&gt;</code>"


def test_the_swarm_page_reads_in_plain_words(client):
    swarm = swarm_default_ensure()
    Swarm.objects.filter(id=swarm.id).update(
        description="The nodes `make run` starts on this machine train here.", default_local=4, default_external=3
    )
    page = client.get(f"/swarms/{swarm.slug}/").content.decode()
    assert "<code>make run</code> starts" in page and "`make run`" not in page
    assert "I = 4" not in page and "J = 3" not in page
    assert "each node trains on 4 of its own groups and 3 from other nodes per round" in page
    # No node-hours yet: no gain figure, in large type or elsewhere; the page says why.
    figures = page[page.index('id="gain"') :]
    assert "not enough data yet" in figures[:400]


def test_a_nodes_swarm_is_on_its_page_and_on_its_card(client):
    owner = make_user(username="ada", display_name="Ada")
    calendar = make_swarm(slug="calendar", title="Calendar tasks")
    node = make_node(owner=owner, name="laptop")
    idle = make_node(owner=owner, name="spare")
    NodeRound.objects.create(node=node, swarm=swarm_default_ensure(), round=1, figures={}, used_count=0)
    NodeRound.objects.create(node=node, swarm=calendar, round=2, figures={}, used_count=0)  # it moved

    page = client.get(f"/nodes/{node.id}/").content.decode()
    assert 'Trains in the swarm <a href="/swarms/calendar/">Calendar tasks</a>' in page
    assert "In no swarm yet" in client.get(f"/nodes/{idle.id}/").content.decode()

    client.force_login(owner)
    me = client.get("/me/").content.decode()
    card = me[me.index(f'id="node-{node.id}"') :]
    card = card[: card.index("</article>")]
    assert '<dt>Swarm</dt><dd><a href="/swarms/calendar/">Calendar tasks</a></dd>' in card
    spare = me[me.index(f'id="node-{idle.id}"') :]
    assert "none yet: it joins one when it connects" in spare[: spare.index("</article>")]
    # The card as an htmx action answers it (after a rename) says the same.
    response = client.post(f"/me/nodes/{node.id}/rename/", {"name": "laptop-2"}, HTTP_HX_REQUEST="true")
    assert "Calendar tasks</a></dd>" in response.content.decode()
