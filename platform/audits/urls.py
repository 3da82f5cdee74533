from django.urls import path

from audits.views import checkpoint_upload

urlpatterns = [
    path("audits/<str:audit_id>/checkpoint", checkpoint_upload, name="audit-checkpoint"),
]
