from django.urls import path

from prebuilt import views

app_name = "prebuilt"

urlpatterns = [
    path("manifest.json", views.manifest, name="manifest"),
    path("<str:folder>/<str:name>", views.model_file, name="file"),
]
