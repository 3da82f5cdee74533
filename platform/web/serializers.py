"""Output shapes of the figures API (web.api). Fields mirror web.selectors' dataclasses."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers


class NodeFiguresSerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    name = serializers.CharField()
    contributor = serializers.CharField()
    model_id = serializers.CharField(help_text="Self-reported by the node.")
    hardware = serializers.CharField(help_text="Self-reported by the node.")
    status = serializers.CharField()
    last_seen_at = serializers.DateTimeField(allow_null=True)
    verified_reward = serializers.FloatField(help_text="Sum of server-verified rewards of its credited groups.")
    accepted = serializers.IntegerField(help_text="Groups the server accepted.")
    rejected = serializers.IntegerField(help_text="Groups the server rejected.")
    acceptance_rate = serializers.FloatField(allow_null=True)
    helped = serializers.IntegerField(help_text="(other node, group) pairs that trained on its groups.")
    recent_credit = serializers.FloatField(help_text="Verified reward per day, 7-day half-life.")
    rounds = serializers.IntegerField(help_text="Round reports received (self-reported).")


class ContributorFiguresSerializer(serializers.Serializer):
    contributor = serializers.CharField()
    nodes = serializers.IntegerField()
    models = serializers.ListField(child=serializers.CharField(), help_text="Self-reported.")
    last_seen_at = serializers.DateTimeField(allow_null=True)
    verified_reward = serializers.FloatField()
    accepted = serializers.IntegerField()
    rejected = serializers.IntegerField()
    acceptance_rate = serializers.FloatField(allow_null=True)
    helped = serializers.IntegerField()
    recent_credit = serializers.FloatField()
    rounds = serializers.IntegerField(help_text="Self-reported.")
    badges = serializers.ListField(child=serializers.CharField(), help_text="Badge kinds (docs/community.md#badges).")


class TeamFiguresSerializer(serializers.Serializer):
    team_id = serializers.IntegerField()
    name = serializers.CharField()
    slug = serializers.CharField(help_text="The team's page: /teams/<slug>/.")
    members = serializers.IntegerField(help_text="Current members.")
    nodes_online = serializers.IntegerField(allow_null=True, help_text="Null while unknown (Redis down).")
    verified_reward = serializers.FloatField(help_text="Verified reward its members earned while members.")
    accepted = serializers.IntegerField(help_text="Groups accepted from its members while members.")
    recent_credit = serializers.FloatField(help_text="Verified reward per day, 7-day half-life.")
    badges = serializers.ListField(child=serializers.CharField(), help_text="Badge kinds (docs/community.md#badges).")


class LeaderboardSerializer(serializers.Serializer):
    swarm = serializers.CharField(allow_null=True, help_text="The swarm whose figures these are; null: the whole site.")
    view = serializers.ChoiceField(choices=["contributors", "nodes", "teams"])
    sort = serializers.CharField()
    order = serializers.ChoiceField(choices=["asc", "desc"])
    page = serializers.IntegerField()
    pages = serializers.IntegerField()
    total = serializers.IntegerField()
    contributors = ContributorFiguresSerializer(many=True, required=False)
    nodes = NodeFiguresSerializer(many=True, required=False)
    teams = TeamFiguresSerializer(many=True, required=False)


class RewardPointSerializer(serializers.Serializer):
    hour = serializers.DateTimeField()
    mean_reward = serializers.FloatField(allow_null=True, help_text="Verified reward per completion.")
    groups = serializers.IntegerField()


class DatasetAccuracySerializer(serializers.Serializer):
    dataset = serializers.CharField()
    accuracy = serializers.FloatField(allow_null=True, help_text="Mean verified reward per completion, 7 days.")
    completions = serializers.IntegerField()
    groups = serializers.IntegerField()


class AhaGroupSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    dataset = serializers.CharField()
    question = serializers.CharField(allow_null=True, help_text="Null once the group's texts aged out.")
    node = serializers.CharField()
    contributor = serializers.CharField()
    nodes_trained = serializers.IntegerField(help_text="Other nodes that trained on it.")
    mean_reward = serializers.FloatField(allow_null=True)
    created_at = serializers.DateTimeField()


class ArmPointSerializer(serializers.Serializer):
    hour = serializers.DateTimeField()
    sharing = serializers.FloatField(allow_null=True, help_text="Mean over the sharing arm's node-hours.")
    silo = serializers.FloatField(allow_null=True, help_text="Mean over the silo arm's node-hours.")


class ArmSerializer(serializers.Serializer):
    nodes = serializers.IntegerField()
    node_hours = serializers.IntegerField()
    mean_reward = serializers.FloatField(
        allow_null=True, help_text="Mean verified reward per completion of its node-hours."
    )


class ArmsSerializer(serializers.Serializer):
    curve = ArmPointSerializer(many=True)
    sharing = ArmSerializer(help_text="Nodes that report J > 0.")
    silo = ArmSerializer(help_text="Nodes that report J = 0.")
    unknown_nodes = serializers.IntegerField(help_text="Nodes whose reports give no J (older clients).")
    gain = serializers.FloatField(allow_null=True, help_text="Sharing minus silo mean reward.")
    gain_low = serializers.FloatField(allow_null=True, help_text="95% interval of the gain (Welch).")
    gain_high = serializers.FloatField(allow_null=True)


class SwarmSerializer(serializers.Serializer):
    generated_at = serializers.DateTimeField()
    nodes_online = serializers.IntegerField(
        allow_null=True, help_text="Nodes with an open socket; null while that is unknown (Redis down)."
    )
    nodes_total = serializers.IntegerField(help_text="Nodes on the leaderboard: not banned, a group accepted.")
    groups_per_minute = serializers.FloatField(help_text="Groups shared per minute, last 10 minutes.")
    pool_size = serializers.IntegerField(help_text="Sampleable groups inside the freshness window.")
    pool_window_seconds = serializers.IntegerField()
    accepted_groups = serializers.IntegerField()
    rejected_groups = serializers.IntegerField()
    acceptance_rate = serializers.FloatField(allow_null=True)
    verified_reward = serializers.FloatField()
    reward_curve = RewardPointSerializer(many=True)
    accuracy = DatasetAccuracySerializer(many=True)
    aha = AhaGroupSerializer(many=True)
    arms = ArmsSerializer(help_text="Swarm against silo, last 48 hours (docs/figures.md).")


class SwarmRefSerializer(serializers.Serializer):
    """A swarm of the site (swarms.Swarm) and its headline figures."""

    slug = serializers.SlugField(help_text="What `sapo-node run --swarm SLUG` names.")
    title = serializers.CharField()
    description = serializers.CharField()
    state = serializers.ChoiceField(choices=["open", "paused", "retired"])
    is_default = serializers.BooleanField(help_text="Where a node that names no swarm goes.")
    catalogue_version = serializers.IntegerField()
    recommended_models = serializers.ListField(child=serializers.CharField(), help_text="Empty: any model.")
    local = serializers.IntegerField(source="default_local", help_text="Recommended I.")
    external = serializers.IntegerField(source="default_external", help_text="Recommended J.")
    created_at = serializers.DateTimeField()


class SwarmListItemSerializer(serializers.Serializer):
    swarm = SwarmRefSerializer()
    nodes_online = serializers.IntegerField(
        allow_null=True, help_text="Online nodes whose socket is in the swarm; null while unknown (Redis down)."
    )
    groups_per_minute = serializers.FloatField(help_text="Groups shared per minute, last 10 minutes.")


class CatalogueEntrySerializer(serializers.Serializer):
    dataset = serializers.CharField(help_text="A reasoning-gym dataset.")
    config = serializers.DictField(help_text="Its keyword configuration.")
    weight = serializers.FloatField(help_text="Its share of a node's draws.")


class HeldoutAccuracySerializer(serializers.Serializer):
    answers = serializers.IntegerField(help_text="Held-out answers scored.")
    accuracy = serializers.FloatField(allow_null=True, help_text="Their summed rewards over their number.")
    low = serializers.FloatField(allow_null=True, help_text="Wilson 95% interval, low end.")
    high = serializers.FloatField(allow_null=True, help_text="Wilson 95% interval, high end.")


class HeldoutArmSerializer(HeldoutAccuracySerializer):
    nodes = serializers.IntegerField()


class HeldoutSpanSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    sharing = HeldoutAccuracySerializer()
    silo = HeldoutAccuracySerializer()


class HeldoutSerializer(serializers.Serializer):
    curve = HeldoutSpanSerializer(many=True, help_text="Six spans from the first answer to the last.")
    sharing = HeldoutArmSerializer(help_text="Nodes that report J > 0; figures from 8 answers.")
    silo = HeldoutArmSerializer(help_text="Nodes that report J = 0; figures from 8 answers.")
    enough = serializers.BooleanField(help_text="Both arms have a figure.")
    unknown_nodes = serializers.IntegerField(help_text="Nodes whose reports give no J (older clients).")


class SwarmDetailSerializer(serializers.Serializer):
    swarm = SwarmRefSerializer()
    catalogue = CatalogueEntrySerializer(many=True, help_text="The current version's entries.")
    figures = SwarmSerializer(help_text="The swarm page's figures and charts, of this swarm.")
    heldout = HeldoutSerializer(help_text="Held-out accuracy, sharing against silo, last 48 hours (docs/figures.md).")


class MyNodeSerializer(NodeFiguresSerializer):
    last_report = serializers.DictField(allow_null=True, help_text="Latest round report, self-reported.")


class CurvePointSerializer(serializers.Serializer):
    hour = serializers.DateTimeField()
    verified_reward = serializers.FloatField()
    mean_reward = serializers.FloatField(allow_null=True)
    accepted = serializers.IntegerField()
    rejected = serializers.IntegerField()


class InboxItemSerializer(serializers.Serializer):
    """One moderation.selectors.InboxEntry: a group out of the pool, and why."""

    id = serializers.UUIDField(source="rollout.id")
    node = serializers.CharField(source="rollout.node.name")
    dataset = serializers.CharField(source="rollout.dataset")
    index = serializers.IntegerField(source="rollout.index")
    round = serializers.IntegerField(source="rollout.round")
    state = serializers.CharField(help_text='"rejected" (verifier or moderator), "quarantined" or "held" (for review).')
    code = serializers.CharField(help_text="The verifier's reason code, \"moderator\", or the automatic rule's key.")
    reason = serializers.CharField(help_text="Why, in words: the verifier's reason, or the moderator's or rule's own.")
    created_at = serializers.DateTimeField(source="rollout.created_at", help_text="When the group was shared.")
    decided_at = serializers.DateTimeField(help_text="When it was rejected, quarantined or held.")


class ProfileCurvePointSerializer(serializers.Serializer):
    hour = serializers.DateTimeField()
    verified_reward = serializers.FloatField()
    accepted = serializers.IntegerField()
    mean_reward = serializers.FloatField(allow_null=True, help_text="Verified reward per completion.")


class ProfileDatasetDaySerializer(serializers.Serializer):
    dataset = serializers.CharField()
    day = serializers.DateField()
    accepted = serializers.IntegerField()
    verified_reward = serializers.FloatField()
    mean_reward = serializers.FloatField(allow_null=True)


class PublicNodeSerializer(serializers.Serializer):
    """A node on a public page: its figures; model and hardware are self-reported."""

    node_id = serializers.IntegerField()
    name = serializers.CharField()
    model_id = serializers.CharField(help_text="Self-reported by the node.")
    hardware = serializers.CharField(help_text="Self-reported by the node.")
    status = serializers.CharField()
    last_seen_at = serializers.DateTimeField(allow_null=True)
    verified_reward = serializers.FloatField()
    accepted = serializers.IntegerField()
    rejected = serializers.IntegerField()
    helped = serializers.IntegerField()
    recent_credit = serializers.FloatField()


class SwarmFiguresSerializer(serializers.Serializer):
    """Figures in one swarm; a page's rows over its swarms add up to its totals."""

    swarm = serializers.SlugField(source="swarm.slug")
    verified_reward = serializers.FloatField()
    accepted = serializers.IntegerField()
    rejected = serializers.IntegerField()
    helped = serializers.IntegerField()
    recent_credit = serializers.FloatField()


class ProfileSerializer(serializers.Serializer):
    """A public page's figures (figures.profiles.Profile)."""

    contributor = serializers.CharField(source="owner.public_name")
    contributor_id = serializers.IntegerField(source="owner.id", help_text="Stable; the export's identifier.")
    team = serializers.SlugField(source="team.slug", allow_null=True, default=None)
    badges = serializers.ListField(child=serializers.CharField())
    verified_reward = serializers.FloatField()
    accepted = serializers.IntegerField()
    rejected = serializers.IntegerField()
    helped = serializers.IntegerField(help_text="Times other contributors' nodes trained on their groups.")
    recent_credit = serializers.FloatField()
    last_seen_at = serializers.DateTimeField(allow_null=True)
    nodes = PublicNodeSerializer(many=True)
    curve = ProfileCurvePointSerializer(many=True, help_text="Verified reward per hour, 7 days.")
    datasets = ProfileDatasetDaySerializer(many=True, help_text="Per dataset and day, 7 days.")
    swarms = SwarmFiguresSerializer(many=True, help_text="The same figures in each swarm with any.")


class TeamMemberSerializer(serializers.Serializer):
    contributor = serializers.CharField(source="user.public_name")
    joined_at = serializers.DateTimeField()
    accepted = serializers.IntegerField(help_text="For this team, while a member.")
    verified_reward = serializers.FloatField(help_text="For this team, while a member.")
    founder = serializers.BooleanField()


class TeamCurvePointSerializer(serializers.Serializer):
    hour = serializers.DateTimeField()
    verified_reward = serializers.FloatField()
    accepted = serializers.IntegerField()


class TeamDetailSerializer(serializers.Serializer):
    """A team's page (figures.teams.TeamDetail)."""

    swarm = serializers.SerializerMethodField(help_text="The swarm of these figures; null: every swarm.")
    name = serializers.CharField(source="team.name")
    slug = serializers.SlugField(source="team.slug")
    description = serializers.CharField(source="team.description")
    url = serializers.CharField(source="team.url")
    figures = TeamFiguresSerializer()
    reward_per_hour = serializers.FloatField(help_text="Verified reward of the last 24 hours / 24.")
    members = TeamMemberSerializer(many=True)
    curve = TeamCurvePointSerializer(many=True, help_text="Verified reward per hour, 7 days.")

    @extend_schema_field(serializers.SlugField(allow_null=True))
    def get_swarm(self, detail: object) -> str | None:
        """The swarm the request picked (the view's context), whose figures these are."""
        swarm = self.context.get("swarm")
        return swarm.slug if swarm is not None else None


class TeamFoundInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, help_text="3-40 letters, digits, spaces, simple punctuation.")
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    url = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class TeamEditInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    url = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class TeamHandOverInputSerializer(serializers.Serializer):
    to = serializers.IntegerField(help_text="The contributor id of another current member.")


class TeamRefSerializer(serializers.Serializer):
    name = serializers.CharField()
    slug = serializers.SlugField()


class MembershipSerializer(serializers.Serializer):
    team = TeamRefSerializer()
    joined_at = serializers.DateTimeField()
    left_at = serializers.DateTimeField(allow_null=True)


class ProfilePrivacySerializer(serializers.Serializer):
    private = serializers.BooleanField(help_text="Anonymous on every public list; public pages answer 404 to others.")
