from django.urls import path

from web import api

urlpatterns = [
    path("leaderboard/", api.LeaderboardApi.as_view(), name="api-leaderboard"),
    path("swarm/", api.SwarmApi.as_view(), name="api-swarm"),
    path("swarms/", api.SwarmListApi.as_view(), name="api-swarms"),
    path("swarms/<slug:slug>/", api.SwarmDetailApi.as_view(), name="api-swarm-one"),
    path("contributors/<str:username>/", api.ContributorApi.as_view(), name="api-contributor"),
    path("public/nodes/<int:node_id>/", api.PublicNodeApi.as_view(), name="api-node-public"),
    path("teams/", api.TeamListApi.as_view(), name="api-teams"),
    path("teams/<slug:slug>/", api.TeamDetailApi.as_view(), name="api-team"),
    path("teams/<slug:slug>/join/", api.TeamJoinApi.as_view(), name="api-team-join"),
    path("teams/<slug:slug>/hand-over/", api.TeamHandOverApi.as_view(), name="api-team-hand-over"),
    path("me/team/", api.MyTeamApi.as_view(), name="api-me-team"),
    path("me/profile/", api.MyProfileApi.as_view(), name="api-me-profile"),
    path("me/nodes/", api.MyNodesApi.as_view(), name="api-me-nodes"),
    path("me/nodes/<int:node_id>/curve/", api.MyNodeCurveApi.as_view(), name="api-me-node-curve"),
    path("me/inbox/", api.MyInboxApi.as_view(), name="api-me-inbox"),
]
