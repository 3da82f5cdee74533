from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin

from accounts.models import User


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    list_display = ("username", "display_name", "email", "is_staff", "banned_at", "date_joined")
    list_filter = ("is_staff", "is_superuser", "is_active", ("banned_at", admin.EmptyFieldListFilter))
    search_fields = ("username", "display_name", "email")
    fieldsets = (
        *DjangoUserAdmin.fieldsets,
        ("SAPO", {"fields": ("display_name", "banned_at")}),
    )
    add_fieldsets = ((None, {"classes": ("wide",), "fields": ("username", "display_name", "password1", "password2")}),)
