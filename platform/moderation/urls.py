from django.urls import path

from moderation import views

app_name = "moderation"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("rollouts/<uuid:rollout_id>/action/", views.rollout_action, name="rollout_action"),
    path("bulk/preview/", views.bulk_preview, name="bulk_preview"),
    path("bulk/apply/", views.bulk_apply, name="bulk_apply"),
    path("nodes/", views.nodes, name="nodes"),
    path("nodes/<int:node_id>/action/", views.node_action, name="node_action"),
    path("contributors/<int:user_id>/action/", views.contributor_action, name="contributor_action"),
    path("flags/<int:flag_id>/resolve/", views.flag_resolve, name="flag_resolve"),
    path("audit/", views.audit, name="audit"),
    path("rules/", views.rules, name="rules"),
    path("rules/<str:key>/", views.rule_update, name="rule_update"),
]
