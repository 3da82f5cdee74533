from django.contrib.auth import login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from accounts.forms import SignupForm
from accounts.services import user_create
from common.errors import ApplicationError


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("/")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = user_create(
                username=form.cleaned_data["username"],
                display_name=form.cleaned_data["display_name"],
                password=form.cleaned_data["password1"],
            )
        except ApplicationError as exc:  # lost a race with another sign-up
            form.add_error(None, exc.message)
        else:
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            return redirect("/")
    return render(request, "accounts/signup.html", {"form": form}, status=400 if form.errors else 200)
