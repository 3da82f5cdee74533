from django.urls import include, path

from web import views

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
    path("me/", views.me, name="me"),
    path("me/nodes/", views.me_nodes, name="me-nodes"),
    path("me/nodes/add/", views.node_add, name="node-add"),
    path("me/alerts/", views.alerts_save, name="alerts-save"),
    path("me/alerts/secret/", views.alerts_secret_rotate, name="alerts-secret"),
    path("me/nodes/<int:node_id>/", views.node_card, name="node-card"),
    path("me/nodes/<int:node_id>/rename/", views.node_rename_view, name="node-rename"),
    path("me/nodes/<int:node_id>/rotate/", views.node_rotate_view, name="node-rotate"),
    path("me/nodes/<int:node_id>/revoke/", views.node_revoke_view, name="node-revoke"),
    path("me/nodes/<int:node_id>/retire/", views.node_retire_view, name="node-retire"),
    path("api/v1/", include("web.api_urls")),
]
