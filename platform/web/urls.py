from django.urls import include, path

from web import export_views, profile_views, team_views, views

app_name = "web"

urlpatterns = [
    path("", views.home, name="home"),
    path("download/", views.download, name="download"),
    path("download/<str:build_id>/<str:filename>", views.download_file, name="download-file"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
    path("leaderboard/table/", views.leaderboard_table, name="leaderboard-table"),
    path("leaderboard/how/", views.leaderboard_how, name="leaderboard-how"),
    path("swarm/", views.swarm, name="swarm"),
    path("swarm/figures/", views.swarm_figures, name="swarm-figures"),
    path("contributors/<str:username>/", profile_views.contributor_view, name="contributor"),
    path("nodes/<int:node_id>/", profile_views.node_view, name="node-public"),
    path("me/privacy/", profile_views.privacy_view, name="me-privacy"),
    path("stats/", export_views.stats_index, name="stats"),
    path("stats/<str:name>", export_views.stats_file, name="stats-file"),
    path("teams/", team_views.team_list_view, name="teams"),
    path("teams/found/", team_views.team_found_view, name="team-found"),
    path("teams/leave/", team_views.team_leave_view, name="team-leave"),
    path("teams/<slug:slug>/", team_views.team_view, name="team"),
    path("teams/<slug:slug>/join/", team_views.team_join_view, name="team-join"),
    path("teams/<slug:slug>/edit/", team_views.team_edit_view, name="team-edit"),
    path("teams/<slug:slug>/hand-over/", team_views.team_hand_over_view, name="team-hand-over"),
    path("teams/<slug:slug>/disband/", team_views.team_disband_view, name="team-disband"),
    path("teams/<slug:slug>/moderate/", team_views.team_moderate_view, name="team-moderate"),
    path("me/", views.me, name="me"),
    path("me/nodes/", views.me_nodes, name="me-nodes"),
    path("me/nodes/add/", views.node_add, name="node-add"),
    path("me/alerts/", views.alerts_save, name="alerts-save"),
    path("me/alerts/secret/", views.alerts_secret_rotate, name="alerts-secret"),
    path("me/alerts/confirmation/", views.alerts_confirmation_resend, name="alerts-confirmation"),
    path("alerts/confirm/<str:token>/", views.alerts_confirm, name="alerts-confirm"),
    path("me/nodes/<int:node_id>/", views.node_card, name="node-card"),
    path("me/nodes/<int:node_id>/rename/", views.node_rename_view, name="node-rename"),
    path("me/nodes/<int:node_id>/rotate/", views.node_rotate_view, name="node-rotate"),
    path("me/nodes/<int:node_id>/revoke/", views.node_revoke_view, name="node-revoke"),
    path("me/nodes/<int:node_id>/retire/", views.node_retire_view, name="node-retire"),
    path("api/v1/", include("web.api_urls")),
]
