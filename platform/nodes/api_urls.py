from django.urls import path

from nodes import api

app_name = "nodes-api"

urlpatterns = [
    path("nodes/", api.NodeListCreateApi.as_view(), name="node-list"),
    path("nodes/<int:node_id>/", api.NodeDetailApi.as_view(), name="node-detail"),
    path("nodes/<int:node_id>/token/rotate/", api.NodeTokenRotateApi.as_view(), name="node-token-rotate"),
    path("nodes/<int:node_id>/token/revoke/", api.NodeTokenRevokeApi.as_view(), name="node-token-revoke"),
]
