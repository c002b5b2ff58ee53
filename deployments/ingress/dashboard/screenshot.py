"""`python -m deployments.ingress.dashboard.screenshot`: a picture of a running router's /dashboard,
taken with the system's headless Chromium (as the browser tests do) after sending a little
traffic from a few places and starting two short drills, so the map has something to show.
`make dashboard-screenshot` writes docs/dashboard.png (in docs/observability.md) this way."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx

CHROMIUM = Path(os.environ.get("EDGE_CHROMIUM", "/usr/bin/chromium"))
# The flags every headless run here uses: no sandbox (root in CI), nothing phoning home.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
PLACES = {  # x-client-geo of a few cities: traffic lands on colos around the world
    "London": "51.5,-0.12",
    "Tokyo": "35.68,139.69",
    "Sao Paulo": "-23.55,-46.63",
    "New York": "40.71,-74.0",
    "Sydney": "-33.87,151.21",
    "Mumbai": "19.08,72.88",
}


def shrink_png(path: Path, colors: int = 128) -> None:
    """A palette PNG (~4x smaller, for the repository); the page has few colours. Pillow comes
    with matplotlib."""
    from PIL import Image

    with Image.open(path) as image:
        palette = image.convert("RGB").quantize(colors, method=Image.Quantize.FASTOCTREE)
    palette.save(path, optimize=True)


def send_traffic(http: httpx.Client, rounds: int) -> None:
    for _ in range(rounds):
        for geo in PLACES.values():
            headers = {"x-client-geo": geo, "x-edge-cache": "bypass"}
            http.post("/v1/moderations", json={"input": "hello"}, headers=headers)
            http.post(
                "/v1/chat/completions",
                json={"model": "glm", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 4},
                headers=headers,
            )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--admin-key", default=os.environ.get("EDGE_ADMIN_KEY"))
    parser.add_argument("--api-key", default=os.environ.get("EDGE_API_KEY", ""))
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    parser.add_argument("--rounds", type=int, default=3, help="requests per place and model")
    args = parser.parse_args(argv)
    if not args.admin_key:
        parser.error("the router's admin key: --admin-key or EDGE_ADMIN_KEY")
    if not CHROMIUM.is_file():
        parser.error(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    admin = {"authorization": f"Bearer {args.admin_key}"}
    user = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(base_url=args.url, timeout=120, headers=user) as http:
        send_traffic(http, args.rounds)
        drills = {"SIN": {"down": True, "duration_s": 60}, "GRU": {"added_latency_ms": 300,
                  "duration_s": 60}}  # fmt: skip
        for colo, fault in drills.items():
            http.post(f"/admin/colos/{colo}/faults", json=fault, headers=admin).raise_for_status()
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS), headless=True
                )
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(f"{args.url}/dashboard#key={args.admin_key}")
                page.wait_for_selector('#colo-SIN[data-state="down"]', timeout=30_000)
                page.wait_for_selector("#traffic tr[data-model]", timeout=30_000)
                time.sleep(1.5)  # one more poll: the sparklines have their latest bucket
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out), full_page=True)
                browser.close()
            shrink_png(args.out)
        finally:
            for colo in drills:
                http.delete(f"/admin/colos/{colo}/faults", headers=admin)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
