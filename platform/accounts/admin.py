from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin

from accounts.forms import AdminLoginForm
from accounts.models import User

# The admin's log-in page says when the log-in limiter (accounts.backends) refused an attempt.
admin.site.login_form = AdminLoginForm


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
