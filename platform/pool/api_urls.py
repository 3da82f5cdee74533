from django.urls import path

from pool.api import PoolStatsView, RolloutDetailView

app_name = "pool-api"

urlpatterns = [
    path("pool/stats/", PoolStatsView.as_view(), name="stats"),
    path("rollouts/<uuid:rollout_id>/", RolloutDetailView.as_view(), name="rollout-detail"),
]
