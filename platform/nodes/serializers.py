from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from nodes.models import NODE_NAME_MAX_LENGTH, Node, NodeStatus
from nodes.selectors import node_status


class NodeCreateInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=NODE_NAME_MAX_LENGTH)
    model_id = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    hardware = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class NodeRenameInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=NODE_NAME_MAX_LENGTH)


class NodeOutputSerializer(serializers.ModelSerializer):
    status = serializers.SerializerMethodField(help_text="banned, retired, online, idle or offline.")
    token_prefix = serializers.SerializerMethodField(help_text="Start of the active token, for recognising it.")

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "model_id",
            "hardware",
            "client_version",
            "status",
            "last_seen_at",
            "created_at",
            "retired_at",
            "token_prefix",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(choices=NodeStatus.choices))
    def get_status(self, node: Node) -> str:
        # A listing passes {"statuses": node_statuses(nodes)} so presence is asked once, not per node.
        statuses = self.context.get("statuses")
        return statuses[node.id] if statuses is not None else node_status(node)

    def get_token_prefix(self, node: Node) -> str | None:
        tokens = getattr(node, "active_tokens", None)
        if tokens is None:
            tokens = list(node.tokens.filter(revoked_at__isnull=True))
        return tokens[0].prefix if tokens else None


class NodeWithTokenOutputSerializer(NodeOutputSerializer):
    token = serializers.CharField(read_only=True, help_text="The node's API token. Shown only in this response.")

    class Meta(NodeOutputSerializer.Meta):
        fields = [*NodeOutputSerializer.Meta.fields, "token"]
        read_only_fields = fields


class TokenOutputSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="The new API token. Shown only in this response.")


class RevokeOutputSerializer(serializers.Serializer):
    revoked = serializers.IntegerField(help_text="How many active tokens were revoked.")
