"""Operations: /healthz, /readyz, /metrics (the ops app) and the Content-Security-Policy header."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.pool import make_group, share_frame
from websockets.sync.client import connect

from pool.models import ModerationStatus
from pool.services import rollout_set_moderation


def scrape(base_url: str, token: str | None = None) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    request = urllib.request.Request(base_url + "/metrics")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def delta(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_healthz_answers_without_touching_the_database(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.content == b"ok\n"
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.django_db
def test_readyz_checks_the_database_and_the_channel_layer(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"ready": True, "database": "ok", "channel_layer": "ok", "retention": "ok"}


@pytest.mark.django_db
def test_readyz_is_503_when_the_channel_layer_is_unreachable(client, settings):
    from channels.layers import channel_layers

    # A Redis that is not there (nothing listens on port 1): what a lost Redis looks like to the site.
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "common.channel_layers.BoundedRedisChannelLayer",
            "CONFIG": {"hosts": [{"address": "redis://127.0.0.1:1/0", "socket_timeout": 1}]},
        }
    }
    channel_layers.backends.clear()
    try:
        response = client.get("/readyz")
    finally:
        channel_layers.backends.clear()
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False and body["database"] == "ok"
    assert body["channel_layer"] != "ok" and body["channel_layer"]  # says what failed


def test_metrics_move_with_a_share_and_a_sample_over_a_real_socket(live_server, node, node_token):
    before = scrape(live_server.url)
    good, forged = make_group(index=3), make_group(index=4)
    forged["rewards"] = [1.0 - r for r in forged["rewards"]]  # claims the wrong rewards
    headers = {"Authorization": f"Bearer {node_token}"}
    with connect(live_server.ws_url + "/ws/node/", additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "hello", "v": 1, "client": "test", "model": "m", "hardware": "h"}))
        assert json.loads(ws.recv(10))["type"] == "welcome"
        ws.send(json.dumps(share_frame(good, forged)))
        ack = json.loads(ws.recv(30))
        assert ack["accepted"] == [good["id"]] and ack["rejected"][0]["reason"] == "reward_mismatch"
        ws.send(json.dumps({"type": "sample", "v": 1, "n": 2}))
        assert json.loads(ws.recv(10))["type"] == "samples"
        during = scrape(live_server.url)
    assert delta(before, during, "sapo_node_sockets_open") == 1
    assert delta(before, during, "sapo_share_messages_total") == 1
    assert delta(before, during, "sapo_group_verdicts_total", verdict="accepted", reason="") == 1
    assert delta(before, during, "sapo_group_verdicts_total", verdict="rejected", reason="reward_mismatch") == 1
    assert delta(before, during, "sapo_verification_seconds_count") == 1
    assert delta(before, during, "sapo_sample_seconds_count") == 1
    assert during[("sapo_verification_seconds_sum", ())] > before.get(("sapo_verification_seconds_sum", ()), 0)
    # Read from the database at scrape time: this test's database holds exactly these groups.
    assert during[("sapo_pool_groups", (("verdict", "accepted"),))] == 1
    assert during[("sapo_pool_groups", (("verdict", "rejected"),))] == 1
    assert during[("sapo_pool_sampleable_groups", ())] == 1
    assert during[("sapo_moderation_held_groups", ())] == 0

    rollout_set_moderation(rollouts=[good["id"]], status=ModerationStatus.HELD)
    deadline = time.monotonic() + 10
    while (after := scrape(live_server.url)) and delta(before, after, "sapo_node_sockets_open") != 0:
        assert time.monotonic() < deadline, "the closed socket is still counted"
        time.sleep(0.2)
    assert after[("sapo_moderation_held_groups", ())] == 1
    assert after[("sapo_pool_sampleable_groups", ())] == 0


@pytest.mark.django_db(transaction=True)
def test_metrics_token_when_set(asgi_server):
    with asgi_server(settings={"SAPO_METRICS_TOKEN": "s3cret"}) as server:
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(server.url)
        assert refused.value.code == 401
        with pytest.raises(urllib.error.HTTPError):
            scrape(server.url, token="wrong")
        assert ("sapo_share_messages_total", ()) in scrape(server.url, token="s3cret")


@pytest.mark.django_db
def test_pages_carry_the_content_security_policy(client, settings):
    response = client.get("/")
    policy = response["Content-Security-Policy"]
    assert policy == settings.CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in policy and "style-src 'self'" in policy and "unsafe" not in policy


@pytest.mark.django_db
def test_https_redirect_spares_the_probes(client, settings):
    # What SAPO_ENV=production sets (test_settings checks the defaults themselves).
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 31_536_000
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    page = client.get("/swarm/")
    assert page.status_code == 301 and page["Location"] == "https://testserver/swarm/"
    for probe in ("/healthz", "/readyz", "/metrics"):
        assert client.get(probe).status_code == 200, probe  # plain HTTP from inside the network
    behind_proxy = client.get("/swarm/", headers={"X-Forwarded-Proto": "https"})
    assert behind_proxy.status_code == 200
    assert behind_proxy["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/static/..%2f..%2fmanage.py", "/static/..%2f..%2f..%2fetc%2fpasswd", "/static/%2e%2e/x"]
)
def test_static_files_refuse_a_path_out_of_their_folders_with_404(live_server, path):
    """The development static handler (runserver and the test servers: the finders) answers a path
    climbing out of the static folders 404, not 500; a real static file is still served."""
    import http.client

    host, port = live_server.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", path)  # sent as written: urllib would normalise it
    response = conn.getresponse()
    assert response.status == 404 and b"manage" not in response.read()
    conn.close()
    with urllib.request.urlopen(live_server.url + "/static/css/site.css", timeout=10) as ok:
        assert ok.status == 200


def test_production_check_warns_when_metrics_have_no_token(settings):
    from ops.checks import metrics_token

    settings.PRODUCTION = True
    settings.SAPO_METRICS_TOKEN = ""
    assert [w.id for w in metrics_token(None)] == ["ops.W003"]
    settings.SAPO_METRICS_TOKEN = "a-scraper-token"
    assert metrics_token(None) == []
    settings.PRODUCTION, settings.SAPO_METRICS_TOKEN = False, ""  # development: /metrics open on purpose
    assert metrics_token(None) == []
