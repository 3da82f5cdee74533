import hashlib
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from factories import make_node, make_node_token, make_user, socket_node

from accounts.models import User
from common.errors import ApplicationError
from nodes.models import Node, NodeStatus, NodeToken
from nodes.selectors import access_node, node_list, node_status
from nodes.services import (
    node_create,
    node_hello_changed,
    node_hello_fields,
    node_rename,
    node_retire,
    node_token_issue,
    node_token_revoke,
    node_token_rotate,
    nodes_mark_seen,
    nodes_record_hellos,
)

pytestmark = pytest.mark.django_db


def error_code(callable_, **kwargs) -> str:
    with pytest.raises(ApplicationError) as info:
        callable_(**kwargs)
    return info.value.code


class TestTokens:
    def test_token_is_returned_once_and_stored_only_as_its_hash(self, node):
        token, plaintext = node_token_issue(node=node)

        assert plaintext.startswith("sapo_") and len(plaintext) > 40
        token.refresh_from_db()
        assert token.token_hash == hashlib.sha256(plaintext.encode()).hexdigest()
        assert plaintext[:13] == token.prefix
        stored = [str(value) for value in NodeToken.objects.values_list(flat=False).get(id=token.id)]
        assert plaintext not in stored

    def test_tokens_differ(self, node):
        assert node_token_issue(node=node)[1] != node_token_issue(node=node)[1]

    def test_valid_token_authenticates_its_node(self, node, node_token):
        assert socket_node(token=node_token) == node
        assert NodeToken.objects.get(node=node).last_used_at is not None

    @pytest.mark.parametrize("token", [None, "", "sapo_", "not-a-sapo-token", "sapo_" + "x" * 43, "sapo_" + "x" * 500])
    def test_missing_malformed_or_unknown_token_is_unauthenticated(self, token):
        assert error_code(socket_node, token=token) == "unauthenticated"

    def test_rotate_revokes_old_tokens_and_returns_a_working_one(self, node, node_token):
        new = node_token_rotate(node=node)

        assert error_code(socket_node, token=node_token) == "unauthenticated"
        assert socket_node(token=new) == node
        assert NodeToken.objects.filter(node=node, revoked_at__isnull=True).count() == 1

    def test_revoke_stops_every_token(self, node, node_token):
        _, second = make_node_token(node=node)

        assert node_token_revoke(node=node) == 2
        assert error_code(socket_node, token=node_token) == "unauthenticated"
        assert error_code(socket_node, token=second) == "unauthenticated"

    def test_retired_node_is_unauthenticated(self, node, node_token):
        node_retire(node=node)
        assert error_code(socket_node, token=node_token) == "unauthenticated"

    def test_banned_node_is_banned(self, node, node_token):
        Node.objects.filter(id=node.id).update(banned_at=timezone.now())
        assert error_code(socket_node, token=node_token) == "banned"

    def test_banned_owner_is_banned(self, user, node, node_token):
        User.objects.filter(id=user.id).update(banned_at=timezone.now())
        assert error_code(socket_node, token=node_token) == "banned"

    def test_authentication_error_statuses(self, node, node_token):
        with pytest.raises(ApplicationError) as info:
            socket_node(token="sapo_unknown")
        assert info.value.status == 401
        Node.objects.filter(id=node.id).update(banned_at=timezone.now())
        with pytest.raises(ApplicationError) as info:
            socket_node(token=node_token)
        assert info.value.status == 403


class TestNodes:
    def test_names_are_unique_per_owner_among_active_nodes(self, user, other_user, node):
        assert error_code(node_create, owner=user, name="laptop") == "name_taken"
        assert node_create(owner=other_user, name="laptop").name == "laptop"
        node_retire(node=node)
        assert node_create(owner=user, name="laptop").name == "laptop"

    @pytest.mark.parametrize("name", ["", "   ", "x" * 65, "<script>", "-dash-first", "a/b"])
    def test_invalid_names_are_refused(self, user, name):
        assert error_code(node_create, owner=user, name=name) == "invalid_name"

    def test_banned_contributor_cannot_create_nodes(self):
        banned = make_user(banned_at=timezone.now())
        assert error_code(node_create, owner=banned, name="box") == "banned"

    def test_rename(self, user, node):
        make_node(owner=user, name="desktop")
        assert node_rename(node=node, name="  big   box ").name == "big box"
        assert error_code(node_rename, node=node, name="desktop") == "name_taken"

    def test_retired_node_cannot_be_renamed_or_get_tokens(self, node):
        node_retire(node=node)
        assert error_code(node_rename, node=node, name="other") == "node_retired"
        assert error_code(node_token_rotate, node=node) == "node_retired"

    def test_hello_is_recorded_cleaned_and_bounded(self, node):
        said = node_hello_fields(client="sapo-node/0.1.0\x00", model="m" * 1000, hardware=["not", "text"])
        assert nodes_record_hellos(hellos={node.id: said}) == 1
        node.refresh_from_db()
        assert node.client_version == "sapo-node/0.1.0"
        assert node.model_id == "m" * 200
        assert node.hardware == ""

    def test_status_banned_and_retired(self, user, node):
        node_retire(node=node)
        assert node_status(node) == NodeStatus.RETIRED
        user.banned_at = timezone.now()
        assert node_status(node) == NodeStatus.BANNED

    def test_mark_seen_updates_last_seen_at_most_once_per_interval(self, node):
        other = make_node(owner=node.owner, name="desktop")
        assert nodes_mark_seen(node_ids=[node.id, other.id]) == 2
        node.refresh_from_db()
        assert node.last_seen_at is not None
        assert nodes_mark_seen(node_ids=[node.id, other.id]) == 0  # seen a moment ago: no write

    def test_a_repeated_hello_is_no_change(self, node, django_assert_num_queries):
        said = node_hello_fields(client="sapo-node/0.1.0", model="tiny", hardware="cpu")
        assert node_hello_changed(node=node, fields=said)
        nodes_record_hellos(hellos={node.id: said})
        node.refresh_from_db()
        with django_assert_num_queries(0):
            assert not node_hello_changed(node=node, fields=said)
            newer = node_hello_fields(client="sapo-node/0.2.0", model="tiny", hardware="cpu")
            assert node_hello_changed(node=node, fields=newer)
        nodes_record_hellos(hellos={node.id: newer})
        node.refresh_from_db()
        assert node.client_version == "sapo-node/0.2.0"

    def test_access_node_is_owner_only(self, user, other_user, node):
        assert access_node(user, node.id) == node
        for who, node_id in [(other_user, node.id), (user, 10**9), (user, "abc")]:
            with pytest.raises(ApplicationError) as info:
                access_node(who, node_id)
            assert (info.value.code, info.value.status) == ("not_found", 404)

    def test_node_list_is_the_owners_active_nodes(self, user, other_user, node):
        retired = make_node(owner=user, name="old")
        node_retire(node=retired)
        make_node(owner=other_user)
        assert list(node_list(owner=user)) == [node]
        assert list(node_list(owner=user, include_retired=True)) == [node, retired]


class TestTokenCommand:
    def run(self, *args: str) -> list[str]:
        out = StringIO()
        call_command("sapo_node_token", *args, stdout=out, stderr=StringIO())
        return out.getvalue().strip().splitlines()

    def test_creates_user_and_node_and_prints_a_working_token_last(self):
        lines = self.run("carol", "rig-1")

        user = User.objects.get(username="carol")
        assert not user.has_usable_password()
        node = socket_node(token=lines[-1])
        assert (node.owner, node.name) == (user, "rig-1")

    def test_reuses_existing_user_and_node(self, user, node, node_token):
        lines = self.run(user.username, node.name)

        assert socket_node(token=lines[-1]) == node
        assert socket_node(token=node_token) == node  # earlier tokens stay valid
        assert Node.objects.filter(owner=user).count() == 1


class TestNodeProvision:
    def test_rotate_revokes_the_earlier_tokens_of_the_same_node(self, user, node, node_token):
        from nodes.services import node_provision

        provisioned, fresh = node_provision(username=user.username, node_name=node.name, rotate=True)

        assert provisioned == node
        assert socket_node(token=fresh) == node
        with pytest.raises(ApplicationError) as exc:
            socket_node(token=node_token)
        assert exc.value.code == "unauthenticated"
