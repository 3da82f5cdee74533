"""The JSON behind every figure of the pages, from the same selectors (web.selectors)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.limits import client_address
from accounts.services import profile_set_private
from common.errors import NotFound
from community.selectors import membership_current, team_get, team_members
from community.services import team_disband, team_edit, team_found, team_hand_over, team_join, team_leave
from figures import leaderboard, profiles, teams
from figures.swarm import swarm_heldout, swarm_overview
from moderation.selectors import rollout_inbox_list
from nodes.selectors import access_node, node_list
from swarms.scope import SITE, Scope
from swarms.selectors import swarm_catalogue, swarm_get, swarm_pick
from web import selectors
from web.serializers import (
    ContributorFiguresSerializer,
    CurvePointSerializer,
    InboxItemSerializer,
    LeaderboardSerializer,
    MembershipSerializer,
    MyNodeSerializer,
    NodeFiguresSerializer,
    ProfilePrivacySerializer,
    ProfileSerializer,
    SwarmDetailSerializer,
    SwarmListItemSerializer,
    SwarmSerializer,
    TeamDetailSerializer,
    TeamEditInputSerializer,
    TeamFiguresSerializer,
    TeamFoundInputSerializer,
    TeamHandOverInputSerializer,
    TeamRefSerializer,
)
from web.swarm_views import swarms_with_figures

_SWARM_PARAM = OpenApiParameter(
    "swarm", OpenApiTypes.STR, description="A swarm's slug: the figures in that swarm. Default: the whole site."
)
_BOARD_PARAMS = [
    OpenApiParameter("view", OpenApiTypes.STR, enum=list(leaderboard.VIEWS), description="Default contributors."),
    OpenApiParameter(
        "sort",
        OpenApiTypes.STR,
        enum=sorted({k for sorts in leaderboard.BOARD_SORTS.values() for k in sorts}),
        description="Default reward; a key the view does not sort by falls back to it.",
    ),
    OpenApiParameter("order", OpenApiTypes.STR, enum=["asc", "desc"], description="Default desc."),
    OpenApiParameter("page", OpenApiTypes.INT, description=f"{leaderboard.PAGE_SIZE} rows a page."),
    _SWARM_PARAM,
]


class LeaderboardApi(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(parameters=_BOARD_PARAMS, responses=LeaderboardSerializer, summary="The public leaderboard")
    def get(self, request: Request) -> Response:
        pick = swarm_pick(request.query_params.get("swarm"))
        board = leaderboard.leaderboard(
            view=request.query_params.get("view", "contributors"),
            sort=request.query_params.get("sort", "reward"),
            order=request.query_params.get("order", "desc"),
            page=request.query_params.get("page", 1),
            scope=pick.scope,
        )
        rows = list(board.page.object_list)
        body = {
            "swarm": pick.swarm.slug if pick.swarm else None,
            "view": board.view,
            "sort": board.sort,
            "order": "desc" if board.descending else "asc",
            "page": board.page.number,
            "pages": board.page.paginator.num_pages,
            "total": board.total,
        }
        if board.view == "contributors":
            body["contributors"] = ContributorFiguresSerializer(rows, many=True).data
        elif board.view == "teams":
            body["teams"] = TeamFiguresSerializer(rows, many=True).data
        else:
            body["nodes"] = NodeFiguresSerializer(rows, many=True).data
        return Response(body)


class SwarmApi(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses=SwarmSerializer, summary="Swarm status: the swarm page's figures and charts")
    def get(self, request: Request) -> Response:
        return Response(SwarmSerializer(swarm_overview(scope=SITE)).data)


class SwarmListApi(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses=SwarmListItemSerializer(many=True), summary="The site's swarms, open first")
    def get(self, request: Request) -> Response:
        rows = [
            {"swarm": s, "nodes_online": f["nodes_online"], "groups_per_minute": f["groups_per_minute"]}
            for s, f in swarms_with_figures()
        ]
        return Response(SwarmListItemSerializer(rows, many=True).data)


class SwarmDetailApi(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses=SwarmDetailSerializer, summary="One swarm: its settings, catalogue and figures")
    def get(self, request: Request, slug: str) -> Response:
        swarm = swarm_get(slug=slug)
        body = {
            "swarm": swarm,
            "catalogue": swarm_catalogue(swarm=swarm).entries,
            "figures": swarm_overview(scope=Scope.swarm(swarm.id)),
            "heldout": swarm_heldout(swarm=swarm),
        }
        return Response(SwarmDetailSerializer(body).data)


class MyNodesApi(APIView):
    @extend_schema(responses=MyNodeSerializer(many=True), summary="My nodes with their figures")
    def get(self, request: Request) -> Response:
        nodes = list(node_list(owner=request.user))
        figures = leaderboard.node_figures_for(nodes)
        reports = selectors.last_reports(nodes=nodes)
        rows = []
        for node in nodes:
            row = dict(NodeFiguresSerializer(figures[node.id]).data)
            report = reports.get(node.id)
            row["last_report"] = {"round": report.round, **report.figures} if report else None
            rows.append(row)
        return Response(rows)


class MyNodeCurveApi(APIView):
    @extend_schema(responses=CurvePointSerializer(many=True), summary="A node's verified reward per hour, 7 days")
    def get(self, request: Request, node_id: int) -> Response:
        node = access_node(request.user, node_id)
        return Response(CurvePointSerializer(profiles.node_curve(node=node), many=True).data)


class MyInboxApi(APIView):
    @extend_schema(
        responses=InboxItemSerializer(many=True),
        summary="My rejection inbox: groups rejected, quarantined or held, each with its reason",
    )
    def get(self, request: Request) -> Response:
        return Response(InboxItemSerializer(rollout_inbox_list(owner=request.user), many=True).data)


class ContributorApi(APIView):
    permission_classes = [AllowAny]

    @extend_schema(responses=ProfileSerializer, summary="A contributor's public page (404 when private)")
    def get(self, request: Request, username: str) -> Response:
        owner = profiles.contributor_public_get(username=username, viewer=request.user)
        return Response(ProfileSerializer(profiles.contributor_profile(owner=owner)).data)


class PublicNodeApi(APIView):
    permission_classes = [AllowAny]

    @extend_schema(responses=ProfileSerializer, summary="A node's public page (404 when its contributor is private)")
    def get(self, request: Request, node_id: int) -> Response:
        node = profiles.node_public_get(node_id=node_id, viewer=request.user)
        return Response(ProfileSerializer(profiles.node_profile(node=node)).data)


class TeamListApi(APIView):
    def get_permissions(self):
        return [AllowAny()] if self.request.method == "GET" else [IsAuthenticated()]

    @extend_schema(
        parameters=[
            OpenApiParameter("q", OpenApiTypes.STR, description="Part of the name."),
            OpenApiParameter("sort", OpenApiTypes.STR, enum=sorted(teams.TEAM_SORTS), description="Default reward."),
            OpenApiParameter("order", OpenApiTypes.STR, enum=["asc", "desc"], description="Default desc."),
            _SWARM_PARAM,
        ],
        responses=TeamFiguresSerializer(many=True),
        summary="Listed teams with their figures",
    )
    def get(self, request: Request) -> Response:
        pick = swarm_pick(request.query_params.get("swarm"))
        rows, _, _ = teams.team_rows(
            q=request.query_params.get("q", ""),
            sort=request.query_params.get("sort", "reward"),
            order=request.query_params.get("order", "desc"),
            scope=pick.scope,
        )
        return Response(TeamFiguresSerializer(rows, many=True).data)

    @extend_schema(
        request=TeamFoundInputSerializer,
        responses={201: TeamRefSerializer},
        summary="Found a team (you become its founder and first member)",
    )
    def post(self, request: Request) -> Response:
        data = TeamFoundInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        team = team_found(founder=request.user, address=client_address(request), **data.validated_data)
        return Response(TeamRefSerializer(team).data, status=status.HTTP_201_CREATED)


class TeamDetailApi(APIView):
    def get_permissions(self):
        return [AllowAny()] if self.request.method == "GET" else [IsAuthenticated()]

    @extend_schema(
        parameters=[_SWARM_PARAM], responses=TeamDetailSerializer, summary="A team's page: figures, members, curve"
    )
    def get(self, request: Request, slug: str) -> Response:
        team = team_get(slug=slug, viewer=request.user)
        pick = swarm_pick(request.query_params.get("swarm"))
        detail = teams.team_detail(team=team, members=team_members(team=team), scope=pick.scope)
        return Response(TeamDetailSerializer(detail, context={"swarm": pick.swarm}).data)

    @extend_schema(request=TeamEditInputSerializer, responses=TeamRefSerializer, summary="Edit a team (its founder)")
    def put(self, request: Request, slug: str) -> Response:
        data = TeamEditInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        team = team_edit(actor=request.user, team=team_get(slug=slug, viewer=request.user), **data.validated_data)
        return Response(TeamRefSerializer(team).data)

    @extend_schema(request=None, responses={204: None}, summary="Disband a team (its founder): every member leaves")
    def delete(self, request: Request, slug: str) -> Response:
        team_disband(actor=request.user, team=team_get(slug=slug, viewer=request.user))
        return Response(status=status.HTTP_204_NO_CONTENT)


class TeamHandOverApi(APIView):
    @extend_schema(
        request=TeamHandOverInputSerializer, responses=TeamRefSerializer, summary="Hand a team over to another member"
    )
    def post(self, request: Request, slug: str) -> Response:
        data = TeamHandOverInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        team = team_get(slug=slug, viewer=request.user)
        return Response(
            TeamRefSerializer(team_hand_over(actor=request.user, team=team, to_user_id=data.validated_data["to"])).data
        )


class TeamJoinApi(APIView):
    @extend_schema(request=None, responses=MembershipSerializer, summary="Join a team (credit counts from now on)")
    def post(self, request: Request, slug: str) -> Response:
        team = team_get(slug=slug, viewer=request.user)
        return Response(MembershipSerializer(team_join(user=request.user, team=team)).data)


class MyTeamApi(APIView):
    @extend_schema(responses=MembershipSerializer, summary="My current team (404 when in none)")
    def get(self, request: Request) -> Response:
        membership = membership_current(user=request.user)
        if membership is None:
            raise NotFound("You are not in a team.", code="not_in_team")
        return Response(MembershipSerializer(membership).data)

    @extend_schema(request=None, responses=MembershipSerializer, summary="Leave my team (its credit stays with it)")
    def delete(self, request: Request) -> Response:
        return Response(MembershipSerializer(team_leave(user=request.user)).data)


class MyProfileApi(APIView):
    @extend_schema(responses=ProfilePrivacySerializer, summary="Whether my public profile is private")
    def get(self, request: Request) -> Response:
        return Response({"private": request.user.profile_private})

    @extend_schema(
        request=ProfilePrivacySerializer,
        responses=ProfilePrivacySerializer,
        summary="Make my profile private or public",
    )
    def patch(self, request: Request) -> Response:
        data = ProfilePrivacySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = profile_set_private(user=request.user, private=data.validated_data["private"])
        return Response({"private": user.profile_private})
