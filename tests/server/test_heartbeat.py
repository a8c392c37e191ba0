"""Sampler heartbeats: the origin hears each subscriber's position; a dead or hostile
origin never blocks a sampler; hostile heartbeats are refused with 4xx."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time
from dataclasses import replace

import pytest
import torch

from services import TOKEN, origin  # noqa: F401 (fixture)
from weight_versions import expected, same_bits
from weight_versions import FAST, follow, memory_url
from weight_teleport.pipeline import PublisherConfig
from weight_teleport.publish import Publisher
from weight_teleport.subscribe import Subscriber
from weight_teleport.server import OriginServer, ServerConfig
from weight_teleport.store import StoreConfig
from weight_teleport.targets.torch import TorchTarget


def zeros() -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(t) for k, t in expected(0).items()}


def until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.05)


def put(server: OriginServer, sampler: str, body: bytes, token: str | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    conn.request("PUT", f"/samplers/{sampler}", body, headers)
    status = conn.getresponse().status
    conn.close()
    return status


def test_the_origin_hears_each_sampler_at_its_version(origin) -> None:  # noqa: F811
    config = replace(FAST, heartbeat_s=0.1, sampler_id="sampler-a")
    with (
        Publisher(origin.url, PublisherConfig(store=StoreConfig(token=TOKEN))) as pub,
        Subscriber(origin.url, TorchTarget(zeros()), config) as sub,
    ):
        for v in range(3):
            pub.publish(expected(v))
        pub.flush()
        follow(sub, 2)
        book = origin.samplers
        until(
            lambda: "sampler-a" in book.samplers and book.samplers["sampler-a"].report.version == 2,
            "a heartbeat at version 2",
        )
        report = book.samplers["sampler-a"].report
        assert report.state == "healthy" and report.versions_behind == 0
        assert report.pause_s is not None and report.ready_s is not None
        assert [u[2] for u in book.updates if u[1] == "sampler-a"][-1] == 2


def test_heartbeats_need_the_read_token_where_the_origin_has_one(tmp_path) -> None:
    config = ServerConfig(root=tmp_path, port=0, token=TOKEN, read_token="reader")
    with OriginServer(config) as server:
        body = json.dumps({"state": "healthy", "version": 1}).encode()
        assert put(server, "s", body) == 401
        assert put(server, "s", body, "wrong") == 403
        assert put(server, "s", body, "reader") == 204
        assert put(server, "t", body, TOKEN) == 204
        assert sorted(server.samplers.samplers) == ["s", "t"]


@pytest.mark.parametrize(
    "sampler, body, status",
    [
        ("ok", b'{"state": "healthy", "version": 3}', 204),
        ("..", b'{"state": "healthy"}', 400),  # not an id
        ("a" * 200, b'{"state": "healthy"}', 400),
        ("ok", b"not json", 400),
        ("ok", b'{"version": 3}', 400),  # no state
        ("ok", b'{"state": "bogus"}', 400),
        ("ok", b'{"state": "healthy", "version": -1}', 400),
        ("ok", b'{"state": "healthy", "pause_s": "slow"}', 400),
        ("ok", b'{"state": "healthy", "last_error": "' + b"x" * 3000 + b'"}', 400),
        ("ok", b'{"state": "healthy", "pad": "' + b"x" * 9000 + b'"}', 413),
    ],
)
def test_hostile_heartbeats_are_refused(origin, sampler, body, status) -> None:  # noqa: F811
    assert put(origin, sampler, body) == status
    assert list(origin.samplers.samplers) == (["ok"] if status == 204 else [])


def test_samplers_turn_stale_then_are_forgotten_and_are_bounded(tmp_path) -> None:
    config = ServerConfig(root=tmp_path, port=0, sampler_stale_s=0.2, sampler_expiry_s=0.6, max_samplers=2)
    with OriginServer(config) as server:
        body = b'{"state": "healthy", "version": 0}'
        assert put(server, "a", body) == put(server, "b", body) == 204
        assert put(server, "c", body) == 503  # the book is full
        book = server.samplers
        until(lambda: book.counts()["stale"] == 2, "both samplers stale")
        until(lambda: put(server, "c", body) == 204, "the expired samplers forgotten")
        assert list(book.samplers) == ["c"]


def _silent_listener() -> socket.socket:
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s


@pytest.mark.parametrize("dead", ["refusing", "silent"])
def test_a_dead_origin_never_blocks_a_sampler(dead: str, caplog) -> None:
    """Heartbeats to an origin that refuses connections, or accepts them and never
    answers: the sampler follows every version, and close() returns."""
    silent = _silent_listener() if dead == "silent" else None
    port = silent.getsockname()[1] if silent else _closed_port()
    url, live = memory_url(), zeros()
    config = replace(FAST, heartbeat_s=0.05, report_to=f"http://127.0.0.1:{port}")
    caplog.set_level(logging.WARNING, "weight_teleport.pipeline.heartbeat")
    try:
        with (
            Publisher(url, PublisherConfig(anchor_every=100)) as pub,
            Subscriber(url, TorchTarget(live), config) as sub,
        ):
            for v in range(6):
                pub.publish(expected(v)).wait()
                follow(sub, v)
            assert same_bits(live, 5)
            time.sleep(0.5)  # heartbeats keep failing meanwhile
            attempts = sub._heartbeat._failures.count
    finally:
        if silent:
            silent.close()
    lines = [r for r in caplog.records if "heartbeat_failed" in r.getMessage()]
    assert attempts >= 1 and 1 <= len(lines) <= attempts.bit_length() + 1


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
