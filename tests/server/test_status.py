"""`/status.json`, the status page at 1,000 samplers, and `weight-teleport status` (text,
`--json`, `--watch`) over file:// and an HTTP origin; retention in words."""

from __future__ import annotations

import http.client
import json
import time
import urllib.request

import pytest

from services import TOKEN, origin  # noqa: F401 (fixture)
from weight_versions import expected
from weight_teleport.cli import main
from weight_teleport.observe.status import missing_version
from weight_teleport.pipeline import PublisherConfig, RetentionConfig
from weight_teleport.publish import Publisher
from weight_teleport.format.manifest import from_json
from weight_teleport.store import StoreConfig, open_store


def publish(url: str, versions, **config) -> None:
    """Publish `versions` one at a time, each with its anchor stored (an anchor is never
    postponed, so which versions retention keeps does not depend on the machine's speed)."""
    with Publisher(url, PublisherConfig(store=StoreConfig(token=TOKEN), **config)) as pub:
        for v in versions:
            pub.publish(expected(v))
            assert pub.flush()


def heartbeat(server, sampler: str, **report) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("PUT", f"/samplers/{sampler}", json.dumps({"state": "healthy", **report}).encode())
    assert conn.getresponse().status == 204
    conn.close()


def get(server, path: str) -> bytes:
    with urllib.request.urlopen(server.url + path) as resp:
        return resp.read()


def test_status_json_pages_and_groups_a_thousand_samplers(origin) -> None:  # noqa: F811
    publish(origin.url, range(3), anchor_every=2)
    book = origin.samplers
    for i in range(1000):  # straight into the book: the HTTP path has its own tests
        from weight_teleport.server.samplers import Report

        book.hear(
            f"s{i:04d}",
            Report(state="failing" if i % 100 == 0 else "healthy", version=2 if i % 10 else 1, pause_s=0.001),
        )
    doc = json.loads(get(origin, "/status.json?limit=20"))
    s = doc["samplers"]
    assert s["total"] == 1000 and s["by_state"]["failing"] == 10 and s["by_state"]["healthy"] == 990
    assert s["by_version"] == {"1": 100, "2": 900}
    assert len(s["items"]) == 20 and all(r["state"] == "failing" for r in s["items"][:10])
    assert s["items"][10]["versions_behind"] == 1  # the most behind next
    page2 = json.loads(get(origin, "/status.json?state=healthy&offset=980&limit=50"))["samplers"]
    assert page2["matched"] == 990 and len(page2["items"]) == 10
    assert json.loads(get(origin, "/status.json?q=s099"))["samplers"]["matched"] == 10
    html = get(origin, "/status").decode()
    assert html.count('<tr data-sampler="s') == 25 and "1000 samplers" in html
    assert len(html) < 200_000  # one page, not a thousand rows
    assert get(origin, "/").startswith(b"<!doctype html>")
    versions = doc["store"]["versions"]
    assert [v["version"] for v in versions] == [0, 1, 2] and versions[2]["anchor"]
    assert versions[1]["age_s"] is not None and versions[1]["ratio"] > 1


@pytest.mark.parametrize("query", ["limit=9999", "offset=-1", "limit=x", "version=y"])
def test_status_json_refuses_bad_queries(origin, query) -> None:  # noqa: F811
    conn = http.client.HTTPConnection("127.0.0.1", origin.port, timeout=10)
    conn.request("GET", "/status.json?" + query)
    assert conn.getresponse().status == 400


def test_status_names_what_retention_removed_and_pull_says_which_exist(tmp_path, capsys) -> None:
    url = f"file://{tmp_path}/store"
    publish(url, range(7), anchor_every=2, retention=RetentionConfig(keep_anchors=2))
    assert main(["status", url]) == 0
    out = capsys.readouterr().out
    assert "the store holds versions 4..6" in out and "versions up to 3 were removed" in out
    with open_store(url) as store:
        manifest = from_json(store.get_manifest())
    assert "removed by retention" in missing_version(manifest, 1)
    assert "not published yet (the latest is 6)" in missing_version(manifest, 9)
    assert main(["pull", url, "--out", str(tmp_path / "out"), "--version", "2"]) == 1
    err = capsys.readouterr().err
    assert "version 2 was removed by retention" in err and "holds versions 4..6" in err


def test_status_of_an_origin_lists_samplers_as_text_and_json(origin, capsys) -> None:  # noqa: F811
    publish(origin.url, range(2))
    heartbeat(origin, "sampler-x", version=1, pause_s=0.002, ready_s=0.3)
    heartbeat(origin, "sampler-y", version=0, last_error="cannot read the store")
    assert main(["status", origin.url]) == 0
    out = capsys.readouterr().out
    assert "2 samplers (2 healthy); by version: v0: 1, v1: 1" in out
    assert out.index("sampler-y") < out.index("sampler-x")  # the most behind first
    assert "cannot read the store" in out
    assert main(["status", origin.url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["store"]["latest"] == 1 and doc["samplers"]["total"] == 2


def test_status_watch_refreshes_until_ctrl_c(origin, capsys, monkeypatch) -> None:  # noqa: F811
    publish(origin.url, range(1))
    ticks = iter([None, KeyboardInterrupt])

    def sleep(_s: float) -> None:
        tick = next(ticks)
        if tick is not None:
            raise tick
        publish(origin.url, [1])

    monkeypatch.setattr(time, "sleep", sleep)
    assert main(["status", origin.url, "--watch", "0.5"]) == 0
    screens = capsys.readouterr().out.split("\x1b[H\x1b[2J")[1:]
    assert len(screens) == 2 and "latest 0" in screens[0] and "latest 1" in screens[1]


@pytest.mark.parametrize("where", ["file", "origin"])
def test_a_damaged_object_shows_and_a_publisher_goes_past_it(where, tmp_path, capsys, request) -> None:
    if where == "file":
        url, root = f"file://{tmp_path}/store", tmp_path / "store"
    else:
        url, root = request.getfixturevalue("origin").url, tmp_path / "origin"
    publish(url, range(2))
    with open_store(url) as store:
        delta = from_json(store.get_manifest()).entries[-1]
    assert delta.kind == "delta"
    path = root / "objects" / delta.key
    path.write_bytes(path.read_bytes()[:100])  # truncated: the baseline cannot be read
    assert main(["status", url]) == 1
    out = capsys.readouterr().out
    assert f"{delta.key} (version 1 delta): shorter than the {delta.size} bytes" in out
    publish(url, [2])  # a fresh anchor, past the damaged delta
    assert main(["status", url, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)["store"]
    assert doc["latest"] == 2 and doc["versions"][-1]["kinds"] == ["snapshot"]
    assert [b["key"] for b in doc["broken"]] == [delta.key]
