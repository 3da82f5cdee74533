from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.http import HttpRequest, HttpResponse

from accounts.backends import LOCKED_ATTR
from accounts.forms import AdminLoginForm, AdminUserAddForm, AdminUserChangeForm
from accounts.models import User

# The admin's log-in page says when the log-in limiter (accounts.backends) refused an attempt, and
# answers it 429, as the site's log-in page does (accounts.views.LoginView).
admin.site.login_form = AdminLoginForm
_admin_login = admin.site.login


def _login_answering_429_when_locked(request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
    response = _admin_login(request, extra_context)
    if getattr(request, LOCKED_ATTR, 0) and response.status_code == 200:
        response.status_code = 429
    return response


admin.site.login = _login_answering_429_when_locked


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    # Names go through accounts.services.user_names_set, as at sign-up (docs/community.md#names).
    form = AdminUserChangeForm
    add_form = AdminUserAddForm
    list_display = ("username", "display_name", "email", "is_staff", "banned_at", "date_joined", "deleted_at")
    list_filter = (
        "is_staff",
        "is_superuser",
        "is_active",
        ("banned_at", admin.EmptyFieldListFilter),
        ("deleted_at", admin.EmptyFieldListFilter),
    )
    search_fields = ("username", "display_name", "email")
    fieldsets = (
        *DjangoUserAdmin.fieldsets,
        ("SAPO", {"fields": ("display_name", "email_confirmed_at", "banned_at", "deleted_at")}),
    )
    add_fieldsets = ((None, {"classes": ("wide",), "fields": ("username", "display_name", "password1", "password2")}),)
