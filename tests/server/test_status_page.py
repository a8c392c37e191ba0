"""The status page in a real headless Chromium (Debian's, driven by Playwright): an
origin, a publisher and three sampler processes; the page shows the three samplers at the
versions they hold, and a stopped one turns stale. A screenshot goes to out/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from services import TOKEN, stop_process
from weight_versions import expected
from weight_teleport.pipeline import PublisherConfig
from weight_teleport.publish import Publisher
from weight_teleport.server import OriginServer, ServerConfig
from weight_teleport.store import StoreConfig

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TESTS = Path(__file__).resolve().parents[1]
OUT = TESTS.parent / "out"
HANG_MS = 90_000  # a guard against a hang, not a speed limit: the page is polled for a state

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not shutil.which("chromium"), reason="apt-get install chromium"
)


def samplers(root: Path, url: str, ids: list[str]) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    return [
        subprocess.Popen(
            [sys.executable, str(TESTS / "sampler_process.py"), url, i],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        for i in ids
    ]


def rows_at(page, version: int, n: int) -> None:
    """Wait until `n` sampler rows show `version`."""
    page.wait_for_function(
        f"document.querySelectorAll('#samplers tr[data-version=\"{version}\"]').length === {n}",
        timeout=HANG_MS,
        polling=200,
    )


def test_the_page_shows_samplers_at_their_versions_and_a_stopped_one_stale(tmp_path) -> None:
    config = ServerConfig(root=tmp_path / "origin", port=0, token=TOKEN, sampler_stale_s=1.5, disk_check_s=0.2)
    ids = ["sampler-a", "sampler-b", "sampler-c"]
    with (
        OriginServer(config) as origin,
        Publisher(origin.url, PublisherConfig(anchor_every=3, store=StoreConfig(token=TOKEN))) as pub,
    ):
        for v in range(3):
            pub.publish(expected(v))
        pub.flush()
        procs = samplers(tmp_path, origin.url, ids)
        try:
            with sync_api.sync_playwright() as p:
                browser = p.chromium.launch(executable_path=shutil.which("chromium") or CHROMIUM, args=FLAGS)
                page = browser.new_page(viewport={"width": 1100, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(origin.url + "/status")
                rows_at(page, 2, 3)
                for v in (3, 4):
                    pub.publish(expected(v))
                pub.flush()
                rows_at(page, 4, 3)
                assert page.inner_text("#summary").startswith("latest version 4")
                stop_process(procs[1])
                page.wait_for_selector('#samplers tr[data-sampler="sampler-b"][data-state="stale"]', timeout=HANG_MS)
                for other in ("sampler-a", "sampler-c"):
                    assert page.get_attribute(f'#samplers tr[data-sampler="{other}"]', "data-state") == "healthy"
                assert "(anchor)" in page.inner_text("#versions")
                page.wait_for_selector("#chart-bytes rect")
                OUT.mkdir(exist_ok=True)
                page.screenshot(path=str(OUT / "status-page.png"), full_page=True)
                assert not errors, errors
                browser.close()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.stdin.close()
                    stop_process(proc)
