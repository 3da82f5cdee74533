"""Public read-only JSON views of the pool (thin: selector -> serializer)."""

from __future__ import annotations

import uuid

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from pool.selectors import pool_stats, rollout_get_public


class DatasetStatsSerializer(serializers.Serializer):
    groups = serializers.IntegerField()
    accepted = serializers.IntegerField()
    sampleable = serializers.IntegerField()


class PoolStatsSerializer(serializers.Serializer):
    groups = serializers.IntegerField(help_text="Groups ever shared, accepted or rejected.")
    accepted = serializers.IntegerField()
    rejected = serializers.IntegerField()
    sampleable = serializers.IntegerField(help_text="Accepted, not moderated out, rewards not all equal.")
    completions = serializers.IntegerField()
    acceptance_rate = serializers.FloatField(allow_null=True)
    datasets = serializers.DictField(child=DatasetStatsSerializer())


class RolloutPublicSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    node = serializers.CharField(source="node.name", help_text="The author node's public name.")
    round = serializers.IntegerField()
    dataset = serializers.CharField()
    seed = serializers.IntegerField()
    index = serializers.IntegerField()
    question = serializers.CharField(allow_null=True, help_text="Null once the group's texts aged out.")
    answer = serializers.CharField(allow_null=True)
    completions = serializers.ListField(
        child=serializers.CharField(), allow_null=True, help_text="Null once the group's texts aged out."
    )
    texts_aged_out = serializers.SerializerMethodField(
        help_text="The texts are kept SAPO_TEXT_RETENTION_DAYS; the ledger (rewards, verdict) for good."
    )
    verified_rewards = serializers.ListField(child=serializers.FloatField(), allow_null=True)
    claimed_rewards = serializers.ListField(child=serializers.FloatField())
    verdict = serializers.CharField()
    reason = serializers.CharField()
    created_at = serializers.DateTimeField()

    def get_texts_aged_out(self, rollout) -> bool:  # noqa: ANN001
        return rollout.completions is None


class PoolStatsView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses=PoolStatsSerializer, summary="Pool statistics (cached for a few seconds)")
    def get(self, request: Request) -> Response:
        return Response(PoolStatsSerializer(pool_stats()).data)


class RolloutDetailView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses=RolloutPublicSerializer, summary="One shared group, as the public sees it")
    def get(self, request: Request, rollout_id: uuid.UUID) -> Response:
        return Response(RolloutPublicSerializer(rollout_get_public(rollout_id=rollout_id)).data)
