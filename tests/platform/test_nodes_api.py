import pytest
from django.urls import reverse
from factories import make_node, socket_node
from rest_framework.test import APIClient

from common.errors import ApplicationError
from nodes.models import NodeToken
from nodes.services import node_token_issue, token_hash

pytestmark = pytest.mark.django_db

LIST = "/api/v1/nodes/"


def detail(node_id: int) -> str:
    return f"/api/v1/nodes/{node_id}/"


class TestListCreate:
    def test_create_returns_the_token_once(self, api_client, user):
        response = api_client.post(LIST, {"name": "laptop", "model_id": "tiny"}, format="json")

        assert response.status_code == 201
        body = response.json()
        assert body["name"] == "laptop" and body["status"] == "offline"
        token = body["token"]
        assert socket_node(token=token).id == body["id"]
        assert NodeToken.objects.get(node_id=body["id"]).token_hash == token_hash(token)
        assert body["token_prefix"] == token[:13]
        # Never shown again.
        assert "token" not in api_client.get(detail(body["id"])).json()
        assert token not in api_client.get(LIST).content.decode()

    def test_list_shows_only_own_active_nodes(
        self, api_client, user, other_user, node, django_assert_num_queries, throttle_queries
    ):
        make_node(owner=user, name="desktop")
        make_node(owner=other_user, name="theirs")

        # session, user, nodes (with owner and presence), active tokens; whatever the number of nodes
        with django_assert_num_queries(4 + throttle_queries):
            response = api_client.get(LIST)

        assert response.status_code == 200
        assert [n["name"] for n in response.json()] == ["laptop", "desktop"]

        for i in range(4):
            make_node(owner=user, name=f"gpu{i}")
        with django_assert_num_queries(4 + throttle_queries):
            assert len(api_client.get(LIST).json()) == 6

    def test_duplicate_name_is_a_409_with_a_code(self, api_client, node):
        response = api_client.post(LIST, {"name": "laptop"}, format="json")
        assert response.status_code == 409
        assert response.json()["code"] == "name_taken"

    def test_invalid_input(self, api_client):
        response = api_client.post(LIST, {}, format="json")
        assert response.status_code == 400
        assert response.json()["code"] == "invalid"
        assert "name" in response.json()["errors"]

        response = api_client.post(LIST, {"name": "<b>"}, format="json")
        assert (response.status_code, response.json()["code"]) == (400, "invalid_name")

    def test_anonymous_is_refused(self, db):
        response = APIClient().get(LIST)
        assert response.status_code == 403
        assert response.json()["code"] == "not_authenticated"

    def test_session_writes_need_csrf(self, user):
        browser = APIClient(enforce_csrf_checks=True)
        browser.force_login(user)
        response = browser.post(LIST, {"name": "laptop"}, format="json")
        assert response.status_code == 403


class TestDetail:
    def test_retrieve_rename_retire(self, api_client, node, node_token):
        assert api_client.get(detail(node.id)).json()["name"] == "laptop"

        response = api_client.patch(detail(node.id), {"name": "big-box"}, format="json")
        assert response.status_code == 200 and response.json()["name"] == "big-box"

        assert api_client.delete(detail(node.id)).status_code == 204
        assert api_client.get(detail(node.id)).json()["status"] == "retired"
        assert api_client.get(LIST).json() == []
        with pytest.raises(ApplicationError, match="node token"):
            socket_node(token=node_token)

    def test_rotate_and_revoke(self, api_client, node, node_token):
        response = api_client.post(reverse("nodes-api:node-token-rotate", args=[node.id]))
        assert response.status_code == 200
        new = response.json()["token"]
        assert socket_node(token=new) == node

        response = api_client.post(reverse("nodes-api:node-token-revoke", args=[node.id]))
        assert response.json() == {"revoked": 1}
        assert api_client.get(detail(node.id)).json()["token_prefix"] is None

    @pytest.mark.parametrize(
        ("method", "suffix", "data"),
        [
            ("get", "", None),
            ("patch", "", {"name": "mine-now"}),
            ("delete", "", None),
            ("post", "token/rotate/", None),
            ("post", "token/revoke/", None),
        ],
    )
    def test_another_users_node_is_404_and_untouched(self, api_client, other_user, method, suffix, data):
        theirs = make_node(owner=other_user, name="theirs")
        _, their_token = node_token_issue(node=theirs)

        response = getattr(api_client, method)(detail(theirs.id) + suffix, data, format="json")

        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
        theirs.refresh_from_db()
        assert theirs.name == "theirs" and theirs.retired_at is None
        assert socket_node(token=their_token) == theirs

    def test_unknown_node_is_404(self, api_client):
        assert api_client.get(detail(10**9)).status_code == 404


def test_schema_and_docs_are_served(api_client):
    response = api_client.get("/api/schema/")
    assert response.status_code == 200
    assert b"/api/v1/nodes/" in response.content
    assert api_client.get("/api/docs/").status_code == 200


def test_a_body_over_the_upload_limit_gets_the_apis_json_error(api_client, settings):
    """Django refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB) when the view reads it: the API
    answers its own JSON error, 413, and stores nothing (not the site's HTML 400 page)."""
    import json

    from nodes.models import Node

    body = json.dumps({"name": "laptop", "model_id": "x" * 3_000_000})
    response = api_client.post(LIST, body, content_type="application/json")
    assert response.status_code == 413
    assert response["Content-Type"] == "application/json"
    assert response.json() == {
        "code": "request_too_large",
        "detail": f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes.",
    }
    assert not Node.objects.exists()
