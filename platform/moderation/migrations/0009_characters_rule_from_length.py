from django.db import migrations

# The character-class limits leave the `length` rule for a rule of their own, `characters`: each
# stored `length` row (the site's and each swarm's) keeps `max_chars` and gives its other parameters,
# with its switch and action, to a `characters` row of the same swarm. A row's unknown parameter
# would make moderation.rules fall back to the defaults, so none is left behind.
CHARACTER_PARAMS = ("max_nonprintable_share", "max_non_ascii_share", "max_repeat_share", "min_chars_for_shares")


def split(apps, schema_editor):
    ModerationRule = apps.get_model("moderation", "ModerationRule")
    for row in ModerationRule.objects.filter(key="length"):
        params = dict(row.params or {})
        moved = {name: params.pop(name) for name in CHARACTER_PARAMS if name in params}
        ModerationRule.objects.update_or_create(
            key="characters",
            swarm_id=row.swarm_id,
            defaults={
                "enabled": row.enabled,
                "action": row.action,
                "params": moved,
                "updated_at": row.updated_at,
                "updated_by_id": row.updated_by_id,
            },
        )
        row.params = params
        row.save(update_fields=["params"])


def join(apps, schema_editor):
    ModerationRule = apps.get_model("moderation", "ModerationRule")
    for row in ModerationRule.objects.filter(key="characters"):
        length = ModerationRule.objects.filter(key="length", swarm_id=row.swarm_id).first()
        if length is not None:
            length.params = {**(length.params or {}), **(row.params or {})}
            length.save(update_fields=["params"])
        row.delete()


class Migration(migrations.Migration):
    dependencies = [("moderation", "0008_rule_per_swarm")]

    operations = [migrations.RunPython(split, join)]
