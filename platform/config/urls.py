from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("accounts.urls")),
    path("api/v1/", include("nodes.api_urls")),
    path("api/v1/", include("pool.api_urls")),
    path("api/v1/", include("audits.urls")),  # a node's checkpoint uploads
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves its start-up script from a URL, not inline (the site's CSP forbids inline).
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="api-schema", template_name="ops/swagger_ui.html"),
        name="api-docs",
    ),
    path("", include("ops.urls")),  # /healthz, /readyz, /metrics
    path("models/", include("prebuilt.urls")),  # the built-in models, prebuilt for nodes
    path("moderation/", include("moderation.urls")),
    # --- Added by other helpers: the web app's pages (home, leaderboard, dashboard) go here. ---
    path("", include("web.urls")),
]

# Error pages in the site's style (web app).
handler400 = "web.views.bad_request"
handler403 = "web.views.permission_denied"
handler404 = "web.views.page_not_found"
handler500 = "web.views.server_error"
