from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.utils.html import format_html
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from accounts import addresses, limits
from accounts.forms import ChangePasswordForm, LoginForm, NewPasswordForm, PasswordResetRequestForm, SignupForm
from accounts.limits import signup_consume
from accounts.services import user_create
from common.errors import ApplicationError, RateLimited


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("/")
    form = SignupForm(request.POST or None)
    status = 200
    if request.method == "POST" and form.is_valid():
        try:
            signup_consume(request)
            user = user_create(
                username=form.cleaned_data["username"],
                display_name=form.cleaned_data["display_name"],
                password=form.cleaned_data["password1"],
                email=form.cleaned_data["email"],
            )
        except ApplicationError as exc:  # over the sign-up limit, or lost a race with another sign-up
            form.add_error(None, exc.message)
            status = exc.status if isinstance(exc, RateLimited) else 400
        else:
            login(request, user, backend="accounts.backends.LimitedModelBackend")
            messages.success(request, _welcome(user.own_name))
            if user.email:
                _send_confirmation(request, user)
            return redirect(reverse("web:me") + "#add-node-title")
    elif form.errors:
        status = 400
    return render(request, "accounts/signup.html", {"form": form}, status=status)


class LoginView(auth_views.LoginView):
    """Django's log-in view with the lockout message (accounts.forms); a locked attempt answers 429."""

    form_class = LoginForm
    template_name = "accounts/login.html"
    redirect_authenticated_user = True

    def form_invalid(self, form: LoginForm) -> HttpResponse:
        response = super().form_invalid(form)
        if form.locked_for:
            response.status_code = 429
        return response


def _welcome(name: str) -> str:
    return format_html(
        'Welcome, {}. Next: <a href="{}">add a node</a> below. It gives you a token and the one command '
        "that installs and starts the node; its groups earn your credit.",
        name,
        reverse("web:me") + "#add-node-title",
    )


class PasswordResetView(auth_views.PasswordResetView):
    """Django's reset request, rate limited (accounts.limits): past the network's limit the form answers
    429; past the address's, the answer is the usual one and no email goes."""

    form_class = PasswordResetRequestForm
    template_name = "accounts/password_reset_form.html"
    email_template_name = "accounts/password_reset_email.txt"
    subject_template_name = "accounts/password_reset_subject.txt"
    success_url = reverse_lazy("accounts:password_reset_done")

    def form_valid(self, form: PasswordResetRequestForm) -> HttpResponse:
        try:
            limits.password_reset_consume(self.request)
        except RateLimited as exc:
            form.add_error(None, exc.message)
            return self.render_to_response(self.get_context_data(form=form), status=exc.status)
        if not limits.password_reset_email_allowed(form.cleaned_data["email"]):
            return HttpResponseRedirect(self.get_success_url())
        return super().form_valid(form)


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    form_class = NewPasswordForm
    template_name = "accounts/password_reset_confirm.html"
    success_url = reverse_lazy("accounts:password_reset_complete")


class PasswordChangeView(auth_views.PasswordChangeView):
    form_class = ChangePasswordForm
    template_name = "accounts/password_change.html"
    success_url = reverse_lazy("accounts:password_change_done")


# ---------------------------------------------------------------------------- the account's address

MY_ACCOUNT = "/me/#account"


def _confirm_link(request: HttpRequest) -> Callable[[str], str]:
    return lambda token: request.build_absolute_uri(reverse("accounts:email-confirm", args=[token]))


def _send_confirmation(request: HttpRequest, user: object) -> None:
    try:
        addresses.user_email_confirmation_send(
            user=user, confirm_link=_confirm_link(request), network=limits.client_address(request)
        )
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.info(
            request, f"A confirmation link was sent to {user.email}: the address is used once it is followed."
        )


@never_cache
@login_required
@require_POST
def email_set(request: HttpRequest) -> HttpResponse:
    try:
        sent = addresses.user_email_set(
            user=request.user,
            email=request.POST.get("email", "")[:1000],
            confirm_link=_confirm_link(request),
            network=limits.client_address(request),
        )
    except ApplicationError as exc:
        messages.error(request, exc.message)
        return redirect(MY_ACCOUNT)
    if sent:
        messages.info(request, f"A confirmation link was sent to {request.user.email}: it is used once followed.")
    elif request.user.email and request.user.email_confirmed_at is None:
        messages.warning(request, f"{request.user.email} is not confirmed: nothing is sent to it until it is.")
    else:
        messages.success(request, "Email address saved." if request.user.email else "Email address removed.")
    return redirect(MY_ACCOUNT)


@never_cache
@login_required
@require_POST
def email_confirmation_resend(request: HttpRequest) -> HttpResponse:
    _send_confirmation(request, request.user)
    return redirect(MY_ACCOUNT)


@never_cache
@require_http_methods(["GET", "POST"])
def email_confirm(request: HttpRequest, token: str) -> HttpResponse:
    """The page a confirmation link opens: a button (a GET confirms nothing: mail scanners open links).
    No login needed: the signed token names the account and the address."""
    try:
        if request.method == "POST":
            user = addresses.user_email_confirm(token=token)
        else:
            user = addresses.user_email_confirmation_read(token=token)
    except ApplicationError as exc:
        return render(request, "accounts/email_confirm.html", {"error": exc.message}, status=400)
    context = {"email": user.email, "confirmed": user.email_confirmed_at is not None}
    return render(request, "accounts/email_confirm.html", context)
