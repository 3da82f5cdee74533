"""The contributor's JSON API for their own nodes (session-authenticated). Views validate, call a
service or selector, and render; access goes through `access_node`."""

from django.utils.cache import add_never_cache_headers
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from nodes import serializers
from nodes.selectors import access_node, node_get, node_list, node_statuses
from nodes.services import node_create, node_rename, node_retire, node_token_issue, node_token_revoke, node_token_rotate


def _secret(response: Response) -> Response:
    """An answer carrying a token: no browser, proxy or cache may keep it (Cache-Control: no-store)."""
    add_never_cache_headers(response)
    return response


class NodeListCreateApi(APIView):
    @extend_schema(responses=serializers.NodeOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        include_retired = request.query_params.get("include_retired") in {"1", "true"}
        nodes = node_list(owner=request.user, include_retired=include_retired)
        context = {"statuses": node_statuses(nodes)}
        return Response(serializers.NodeOutputSerializer(nodes, many=True, context=context).data)

    @extend_schema(
        request=serializers.NodeCreateInputSerializer,
        responses={201: serializers.NodeWithTokenOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        data = serializers.NodeCreateInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node = node_create(owner=request.user, **data.validated_data)
        _, plaintext = node_token_issue(node=node)
        node = node_get(node_id=node.id)
        node.token = plaintext
        return _secret(Response(serializers.NodeWithTokenOutputSerializer(node).data, status=status.HTTP_201_CREATED))


class NodeDetailApi(APIView):
    @extend_schema(responses=serializers.NodeOutputSerializer)
    def get(self, request: Request, node_id: int) -> Response:
        node = access_node(request.user, node_id)
        return Response(serializers.NodeOutputSerializer(node).data)

    @extend_schema(request=serializers.NodeRenameInputSerializer, responses=serializers.NodeOutputSerializer)
    def patch(self, request: Request, node_id: int) -> Response:
        node = access_node(request.user, node_id)
        data = serializers.NodeRenameInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node = node_rename(node=node, name=data.validated_data["name"])
        return Response(serializers.NodeOutputSerializer(node).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, node_id: int) -> Response:
        """Retire the node: tokens revoked, name freed, history kept."""
        node_retire(node=access_node(request.user, node_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class NodeTokenRotateApi(APIView):
    @extend_schema(request=None, responses=serializers.TokenOutputSerializer)
    def post(self, request: Request, node_id: int) -> Response:
        plaintext = node_token_rotate(node=access_node(request.user, node_id))
        return _secret(Response(serializers.TokenOutputSerializer({"token": plaintext}).data))


class NodeTokenRevokeApi(APIView):
    @extend_schema(request=None, responses=serializers.RevokeOutputSerializer)
    def post(self, request: Request, node_id: int) -> Response:
        revoked = node_token_revoke(node=access_node(request.user, node_id))
        return Response(serializers.RevokeOutputSerializer({"revoked": revoked}).data)
