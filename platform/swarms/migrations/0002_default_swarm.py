"""The default swarm, made from the site's catalogue (settings.SAPO_CATALOGUE), so a site that had one
pool keeps serving today's clients unchanged: its groups, rounds and consumptions join this swarm
(pool migration 0007). Its sample sequence is made there, from the pool's."""

from django.conf import settings
from django.db import migrations


def default_swarm(apps, schema_editor) -> None:
    from sapo_node.tasks import CATALOGUES
    from swarms.catalogue import entries_of_catalogue
    from swarms.models import DEFAULT_SLUG, DEFAULT_TITLE

    Swarm = apps.get_model("swarms", "Swarm")
    SwarmCatalogue = apps.get_model("swarms", "SwarmCatalogue")
    if Swarm.objects.filter(is_default=True).exists():
        return
    catalogue = CATALOGUES[getattr(settings, "SAPO_CATALOGUE", None) or "sapo"]
    swarm = Swarm.objects.create(slug=DEFAULT_SLUG, title=DEFAULT_TITLE, is_default=True, catalogue_version=1)
    SwarmCatalogue.objects.create(swarm=swarm, version=1, entries=entries_of_catalogue(catalogue))


class Migration(migrations.Migration):
    dependencies = [("swarms", "0001_initial")]

    operations = [migrations.RunPython(default_swarm, migrations.RunPython.noop)]
