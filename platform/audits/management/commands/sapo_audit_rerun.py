"""`manage.py sapo_audit_rerun`: run errored audits again, on the uploads they kept (docs/audits.md,
"Outcomes"), once the fault that errored them is mended."""

from __future__ import annotations

import uuid

from django.core.management.base import BaseCommand, CommandError

from audits.jobs import audit_rerun
from audits.models import Audit, AuditState
from common.errors import ApplicationError


class Command(BaseCommand):
    help = "Run errored audits again on the uploads they kept: the ids given, or --all-errored."

    def add_arguments(self, parser):
        parser.add_argument("audit_ids", nargs="*", help="Ids of errored audits.")
        parser.add_argument(
            "--all-errored", action="store_true", help="Every errored audit whose upload is still kept."
        )

    def handle(self, *args, audit_ids: list[str], all_errored: bool, **options):
        if all_errored:
            found = Audit.objects.filter(state=AuditState.ERRORED).exclude(upload_path="").order_by("finished_at")
            audit_ids = [str(i) for i in found.values_list("id", flat=True)]
        elif not audit_ids:
            raise CommandError("name audit ids, or --all-errored")
        refused = 0
        for audit_id in audit_ids:
            try:
                audit_rerun(audit_id=_uuid(audit_id))
            except ApplicationError as exc:
                refused += 1
                self.stderr.write(f"audit {audit_id}: {exc.code}: {exc.message}")
            else:
                self.stdout.write(f"audit {audit_id}: queued again")
        if refused:
            raise CommandError(f"{refused} of {len(audit_ids)} audit(s) not run again")


def _uuid(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ApplicationError("not_found", f"{text[:64]!r} is not an audit id") from None
