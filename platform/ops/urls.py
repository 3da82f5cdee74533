from django.urls import path

from ops import views

app_name = "ops"

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", views.metrics, name="metrics"),
    path("favicon.ico", views.favicon, name="favicon"),
]
