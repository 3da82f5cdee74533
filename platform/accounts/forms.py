import math
from collections.abc import Iterator

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import password_validation
from django.contrib.auth.forms import (
    AdminUserCreationForm,
    AuthenticationForm,
    PasswordChangeForm,
    PasswordResetForm,
    SetPasswordForm,
    UserChangeForm,
)

from accounts.backends import LOCKED_ATTR
from accounts.models import DISPLAY_NAME_MAX_LENGTH, User
from accounts.passwords import MAX_PASSWORD_LENGTH, password_help_text_html
from accounts.services import display_name_clean, display_name_is_taken, name_is_taken, user_names_set, username_clean
from common.errors import ApplicationError

LOCKED_MESSAGE = (
    "Too many failed log-ins for this account or from your network. Log-in is locked for %(minutes)s more "
    "minute(s), whatever the password."
)


class _LockoutMessage:
    """For the log-in forms: when the backend refused an attempt under a lock (accounts.backends), say
    so instead of "wrong password" (a contributor would otherwise keep trying the right one)."""

    request: object

    @property
    def locked_for(self) -> int:
        return getattr(self.request, LOCKED_ATTR, 0) if self.request is not None else 0

    def get_invalid_login_error(self) -> forms.ValidationError:
        if self.locked_for:
            return forms.ValidationError(
                self.error_messages["locked"], code="locked", params={"minutes": math.ceil(self.locked_for / 60)}
            )
        return super().get_invalid_login_error()


class LoginForm(_LockoutMessage, AuthenticationForm):
    error_messages = {**AuthenticationForm.error_messages, "locked": LOCKED_MESSAGE}


class AdminLoginForm(_LockoutMessage, AdminAuthenticationForm):
    error_messages = {**AdminAuthenticationForm.error_messages, "locked": LOCKED_MESSAGE}


class SignupForm(forms.Form):
    """Validates a sign-up; the account itself is created by accounts.services.user_create."""

    username = forms.CharField(
        max_length=150,
        help_text="For logging in. Letters, digits and @/./+/-/_ only.",
        validators=[User.username_validator],
        widget=forms.TextInput(attrs={"autocomplete": "username", "autofocus": True}),
    )
    display_name = forms.CharField(max_length=DISPLAY_NAME_MAX_LENGTH, help_text="Shown publicly on the leaderboard.")
    email = forms.EmailField(
        required=False,
        max_length=254,
        label="Email (optional)",
        help_text="Never shown. For a password reset and, if you turn them on, alerts about your nodes; "
        "used once you follow the link mailed to it.",
        widget=forms.EmailInput(attrs={"autocomplete": "email"}),
    )
    password1 = forms.CharField(
        label="Password",
        strip=False,
        max_length=MAX_PASSWORD_LENGTH,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text=password_help_text_html(),
    )
    password2 = forms.CharField(
        label="Password (again)",
        strip=False,
        max_length=MAX_PASSWORD_LENGTH,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )

    def clean_username(self) -> str:
        try:
            username = username_clean(self.cleaned_data["username"])
        except ApplicationError as exc:
            raise forms.ValidationError(exc.message, code=exc.code) from None
        if name_is_taken(username):
            raise forms.ValidationError("This username is taken.")
        return username

    def clean_display_name(self) -> str:
        try:
            display_name = display_name_clean(self.cleaned_data["display_name"])
        except ApplicationError as exc:
            raise forms.ValidationError(exc.message, code=exc.code) from None
        if display_name_is_taken(display_name):
            raise forms.ValidationError("This display name is taken.")
        return display_name

    def clean(self) -> dict:
        cleaned = super().clean()
        password1, password2 = cleaned.get("password1"), cleaned.get("password2")
        if password1 and password2 and password1 != password2:
            self.add_error("password2", "The two passwords differ.")
        elif password1:
            candidate = User(username=cleaned.get("username", ""), display_name=cleaned.get("display_name", ""))
            try:
                password_validation.validate_password(password1, candidate)
            except forms.ValidationError as exc:
                self.add_error("password1", exc)
        return cleaned


class _NewPasswordHelp:
    """The new password's field bounded (accounts.passwords) and its help in the order that matters."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["new_password1"]
        field.help_text = password_help_text_html()
        field.max_length = MAX_PASSWORD_LENGTH
        field.widget.attrs["maxlength"] = str(MAX_PASSWORD_LENGTH)


class NewPasswordForm(_NewPasswordHelp, SetPasswordForm):
    """The new password a reset link leads to."""


class ChangePasswordForm(_NewPasswordHelp, PasswordChangeForm):
    """A logged-in contributor's password change (the old password first)."""


class PasswordResetRequestForm(PasswordResetForm):
    """Asks for a reset link. Only an account whose address is confirmed gets one (accounts.addresses:
    an address typed at sign-up and never confirmed may be anyone's); every other address gets the
    same answer and no email, so the form tells no one which addresses have accounts."""

    email = forms.EmailField(label="Email", max_length=254, widget=forms.EmailInput(attrs={"autocomplete": "email"}))

    def get_users(self, email: str) -> Iterator[User]:
        return (user for user in super().get_users(email) if user.email_confirmed_at is not None)


class _NamedThroughTheService:
    """The admin's user forms name an account as sign-up does: `user_names_set` checks the username and
    display name (reserved names, invisible characters, blanks, look-alikes of every account's names)
    and writes their fingerprints on the instance the form saves. A change that leaves both names as
    they are is not checked again, so an account can be banned whatever name it holds."""

    instance: User
    cleaned_data: dict
    changed_data: list[str]

    def clean(self) -> dict:
        cleaned = super().clean()
        if self.instance.pk is not None and not {"username", "display_name"} & set(self.changed_data):
            return cleaned
        if "username" in self.errors or "display_name" in self.errors:
            return cleaned
        try:
            user_names_set(
                user=self.instance,
                username=cleaned.get("username", self.instance.username),
                display_name=cleaned.get("display_name", self.instance.display_name),
            )
        except ApplicationError as exc:
            self.add_error(exc.extra.get("field"), forms.ValidationError(exc.message, code=exc.code))
        else:
            cleaned["username"], cleaned["display_name"] = self.instance.username, self.instance.display_name
        return cleaned


class AdminUserAddForm(_NamedThroughTheService, AdminUserCreationForm):
    """The admin's form that makes an account."""


class AdminUserChangeForm(_NamedThroughTheService, UserChangeForm):
    """The admin's form that changes an account."""
