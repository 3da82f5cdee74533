"""The commands /download/ and the token box show, as a contributor copies them: one command a line
(no continuation, no placeholder a shell would read as a redirection), each block with a Copy button,
torch first from the index that fits the machine at the version the client is tested with, and the
run command naming the swarm (a picker when the site has several open)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from django.urls import reverse
from factories import make_swarm

from swarms.models import Swarm, SwarmState
from web.install import TORCH_CPU_INDEX, TORCH_VERSION, TRANSFORMERS_VERSION

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]


def _blocks(page: str) -> dict[str, list[str]]:
    """Each command block of the page by its id: its lines, as the Copy button copies them."""
    found = {}
    for block_id, body in re.findall(r'<pre class="command" id="([\w-]+)"><code>(.*?)</code></pre>', page, re.S):
        found[block_id] = html.unescape(re.sub(r"<[^>]+>", "", body)).split("\n")
    return found


def test_every_command_is_a_whole_line_with_a_copy_button(client):
    page = client.get("/download/").content.decode()
    blocks = _blocks(page)
    assert {"install-command-cpu-commands", "install-command-cuda-commands", "install-command-mps-commands"} <= set(
        blocks
    )
    for block_id, lines in blocks.items():
        assert f'data-copy="#{block_id}"' in page, f"{block_id} has no Copy button"
        for line in lines:
            assert line.strip() and not line.rstrip().endswith("\\"), f"{block_id}: {line!r} continues on the next line"
            assert "<" not in line and ">" not in line, f"{block_id}: {line!r} has a placeholder a shell redirects"
    # Every <pre> on the page is such a block (none left without its button).
    assert page.count("<pre") == len(blocks)


def test_a_cpu_machine_installs_torchs_cpu_build_first_at_the_tested_versions(client):
    blocks = _blocks(client.get("/download/").content.decode())
    cpu = blocks["install-command-cpu-commands"]
    torch_line = f"pip install torch=={TORCH_VERSION} --index-url {TORCH_CPU_INDEX}"
    client_line = next(i for i, line in enumerate(cpu) if "sapo_node-" in line and line.startswith("pip install"))
    assert cpu.index(torch_line) < client_line
    assert f"transformers=={TRANSFORMERS_VERSION}" in cpu[client_line]
    assert cpu[-1].startswith("SAPO_TOKEN=YOUR_NODE_TOKEN sapo-node run --server ws://testserver/ws/node/")
    assert cpu[-1].endswith("--device cpu")
    assert blocks["install-command-cuda-commands"][-1].endswith("--device cuda")
    mps = blocks["install-command-mps-commands"]
    assert mps[0] == "python3 -m venv ~/sapo && source ~/sapo/bin/activate" and mps[-1].endswith("--device mps")
    assert all("whl/cpu" not in line for line in blocks["install-command-cuda-commands"] + mps)


def test_the_pinned_versions_are_the_ones_the_project_tests_with():
    makefile = (REPO / "Makefile").read_text()
    dockerfile = (REPO / "Dockerfile").read_text()
    lock = (REPO / "requirements" / "lock.txt").read_text()
    assert f'"torch=={TORCH_VERSION}"' in makefile and f'"torch=={TORCH_VERSION}"' in dockerfile
    assert re.search(rf"^transformers=={re.escape(TRANSFORMERS_VERSION)}$", lock, re.M)


def test_commands_name_the_swarm_and_a_picker_chooses_among_open_ones(client):
    Swarm.objects.exclude(state=SwarmState.RETIRED).update(state=SwarmState.PAUSED)
    only = make_swarm(slug="easy", title="Easy tasks")
    page = client.get("/download/").content.decode()
    assert "data-swarm-picker" not in page and "join the swarm" in page
    assert _blocks(page)["install-command-cpu-commands"][-1].count("--swarm easy ") == 1

    make_swarm(slug="paper", title="The paper's tasks")
    make_swarm(slug="closed", title="Paused")
    Swarm.objects.filter(slug="closed").update(state=SwarmState.PAUSED)
    page = client.get("/download/").content.decode()
    picker = page[page.index("data-swarm-picker") : page.index("</select>")]
    assert 'value="easy"' in picker and 'value="paper"' in picker and 'value="closed"' not in picker
    chosen = client.get("/download/?swarm=paper").content.decode()
    assert all("--swarm easy" not in line for lines in _blocks(chosen).values() for line in lines)
    assert "--swarm paper " in _blocks(chosen)["install-command-cuda-commands"][-1]
    assert "--swarm paper " in _blocks(chosen)["smollm2-commands"][-1]
    # A swarm that is not open, or no swarm at all, falls back to the first open one.
    for slug in ("closed", "nope", "x" * 500):
        assert (
            f"--swarm {only.slug} "
            in _blocks(client.get(f"/download/?swarm={slug}").content.decode())["install-command-cpu-commands"][-1]
        )


def test_the_token_box_puts_the_token_and_the_swarm_in_the_commands(auth_client):
    make_swarm(slug="easy")
    response = auth_client.post(reverse("web:node-add"), {"name": "laptop"})
    page = response.content.decode()
    token = re.search(r'id="token-value">(sapo_[^<]+)<', page).group(1)
    run = _blocks(page)["token-command-cpu-commands"][-1]
    assert run.startswith(f"SAPO_TOKEN={token} sapo-node run --server ws://testserver/ws/node/ --swarm ")
    assert 'data-copy="#token-command-cpu-commands"' in page and "YOUR_NODE_TOKEN" not in page


def test_the_token_boxs_swarm_picker_never_leaves_the_page(auth_client):
    make_swarm(slug="easy")
    make_swarm(slug="paper")
    page = auth_client.post(reverse("web:node-add"), {"name": "laptop"}).content.decode()
    assert 'id="token-command-swarm"' in page  # the picker, rewriting the commands in place (site.js)
    assert "Show its commands" not in page  # no submit that would navigate away from a token shown once
    assert "Show its commands" in auth_client.get("/download/").content.decode()
