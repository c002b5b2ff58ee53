"""The live edge map in a real headless Chromium against the running cluster: every colo drawn,
a drill started from the page turns its colo "down" within 3 s and back after clearing, a real
cold start shows kimi's replicas going 0 -> 1, and a screenshot goes to the artefacts."""

from __future__ import annotations

import threading

import httpx
import pytest
from conftest import ADMIN_KEY, USER, wait_until

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
KIMI_CELL = '#regions td[data-model="kimi"]'


@pytest.fixture
def kimi_at_zero(serve_cluster) -> None:
    wait_until(lambda: serve_cluster.running_replicas("kimi") == 0, 120, "kimi at zero", every_s=2)


def test_the_dashboard_shows_the_live_edge(serve_cluster, kimi_at_zero, chromium, artefacts):
    base = serve_cluster.base_url
    colos = httpx.get(f"{base}/admin/colos", headers=ADMIN, timeout=30).json()
    page = chromium.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{base}/dashboard#key={ADMIN_KEY}")
    page.wait_for_selector("#colos circle[data-state]", timeout=30_000)
    drawn = page.eval_on_selector_all("#colos circle", "cs => cs.map(c => c.dataset.colo)")
    assert sorted(drawn) == sorted(colo["id"] for colo in colos)

    # A drill from the page: down within 3 s (the page polls every second), back after clearing.
    page.select_option("#drill-colo", "NRT")
    page.select_option("#drill-kind", "down")
    page.fill("#drill-duration", "120")
    page.click("#drill-start")
    page.wait_for_selector('#colo-NRT[data-state="down"]', timeout=3_000)
    page.click("#drill-clear")
    page.wait_for_selector('#colo-NRT:not([data-state="down"])', timeout=3_000)

    # A real cold start: kimi is at zero; one request brings a replica up.
    page.wait_for_selector(f'{KIMI_CELL}[data-running="0"]', timeout=10_000)
    chat = {"model": "kimi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    answers: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{base}/v1/chat/completions", json=chat, headers=USER, timeout=180)
        )
    )
    sender.start()
    page.wait_for_selector(f'{KIMI_CELL}[data-running="1"]', timeout=180_000)
    sender.join(180)
    assert answers and answers[0].status_code == 200
    assert answers[0].headers["x-edge-cold-start"] == "1"
    # The cold start is listed, and its request is in the traffic table.
    page.wait_for_selector('#cold-starts li[data-model="kimi"]', timeout=10_000)
    page.wait_for_selector('#traffic tr[data-model="kimi"]', timeout=10_000)
    page.screenshot(path=str(artefacts / "dashboard.png"), full_page=True)
    assert errors == []
