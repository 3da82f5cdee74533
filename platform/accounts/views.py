from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from accounts.forms import LoginForm, SignupForm
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
            )
        except ApplicationError as exc:  # over the sign-up limit, or lost a race with another sign-up
            form.add_error(None, exc.message)
            status = exc.status if isinstance(exc, RateLimited) else 400
        else:
            login(request, user, backend="accounts.backends.LimitedModelBackend")
            return redirect("/")
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
