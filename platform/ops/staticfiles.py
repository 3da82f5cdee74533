"""Static file finders for the development server (runserver and the test servers serve static files
from the finders; production serves STATIC_ROOT, collected, behind the proxy).

Django's finders raise SuspiciousFileOperation for a path that climbs out of their folders
(`/static/..%2f..%2fmanage.py`), and the static handler, which turns only Http404 into an answer, let
it out as a 500. A path that cannot be inside a folder is simply not found there: 404.
"""

from __future__ import annotations

from django.contrib.staticfiles import finders
from django.core.exceptions import SuspiciousFileOperation


class _OutsideIsNotFound:
    def find(self, path: str, *args, **kwargs):
        try:
            return super().find(path, *args, **kwargs)
        except SuspiciousFileOperation:
            return []


class FileSystemFinder(_OutsideIsNotFound, finders.FileSystemFinder):
    pass


class AppDirectoriesFinder(_OutsideIsNotFound, finders.AppDirectoriesFinder):
    pass
