from django.contrib import admin
from django.db import models

from common.json_input import BoundedJSONFormField
from pool.models import Consumption, NodeRound, NodeVerdictCounts, Rollout


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    list_display = ("id", "node", "dataset", "verdict", "reason", "moderation_status", "sampleable", "created_at")
    list_filter = ("verdict", "reason", "moderation_status", "sampleable", "dataset")
    search_fields = ("id",)
    raw_id_fields = ("node",)
    readonly_fields = ("sample_seq", "sampleable", "has_variance", "verified_rewards", "claimed_rewards")
    date_hierarchy = "created_at"
    formfield_overrides = {models.JSONField: {"form_class": BoundedJSONFormField}}
    show_full_result_count = False  # counting millions of rows on every page is slow


@admin.register(NodeVerdictCounts)
class NodeVerdictCountsAdmin(admin.ModelAdmin):
    list_display = ("node", "accepted_groups", "rejected_groups", "updated_at")
    raw_id_fields = ("node",)


@admin.register(NodeRound)
class NodeRoundAdmin(admin.ModelAdmin):
    list_display = ("node", "round", "used_count", "created_at")
    formfield_overrides = {models.JSONField: {"form_class": BoundedJSONFormField}}
    raw_id_fields = ("node",)


@admin.register(Consumption)
class ConsumptionAdmin(admin.ModelAdmin):
    list_display = ("consumer", "author", "rollout", "round", "created_at")
    raw_id_fields = ("consumer", "author", "rollout")
