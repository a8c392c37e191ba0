"""The origin under connections that hold it without finishing: idle sockets, a request
head trickled in, an upload body that stalls, a response nobody reads. Real sockets;
short configured limits, generous waits, outcomes asserted (not durations)."""

from __future__ import annotations

import http.client
import logging
import resource
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Iterator

import pytest

from services import TOKEN, answers_http, free_port, stop_process, wait_until
from weight_teleport.store.keys import content_hash, manifest_etag
from weight_teleport.server import OriginServer, ServerConfig
from weight_teleport.store import StoreConfig, open_store

# `weight-teleport serve` without the CLI's other commands (which import torch: seconds).
SERVE = ("-m", "weight_teleport.cli", "serve")
PATIENCE_S = 30.0  # how long a test waits for a cut that the server makes after ~1 s
HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"


@pytest.fixture
def strict(tmp_path: Path) -> Iterator[OriginServer]:
    """An origin with a small connection cap and 1 s stall limits."""
    config = ServerConfig(
        root=tmp_path / "origin",
        port=0,
        token=TOKEN,
        max_object_bytes=16 << 20,
        max_connections=40,
        header_timeout_s=1.0,
        body_timeout_s=1.0,
        keepalive_timeout_s=60.0,
    )
    with OriginServer(config) as server:
        yield server


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S)


def answer_or_close(sock: socket.socket) -> bytes:
    """What the server sends before closing (b"" if it only closes)."""
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def status_of(port: int, path: str, token: str | None = None) -> int:
    """The status of one GET on a new connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PATIENCE_S)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        return conn.getresponse().status
    finally:
        conn.close()


def hold(server: OriginServer, request: bytes, started) -> socket.socket:
    """A connection that sends `request` and reads nothing, once the server started on it
    (`started()`) or answered it at once."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(PATIENCE_S)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(request)
    wait_until(lambda: started() or select.select([sock], [], [], 0)[0], PATIENCE_S, "the server's start on a request")
    return sock


def response_of(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of the answer on `sock` (0 if it closed without one)."""
    resp = http.client.HTTPResponse(sock)
    try:
        resp.begin()
        return resp.status, dict(resp.getheaders()), resp.read()
    except (http.client.HTTPException, ConnectionResetError):
        return 0, {}, b""


def works(url: str) -> None:
    """A well-behaved client uploads and reads back."""
    store = open_store(url, StoreConfig(token=TOKEN))
    store.put("ok", b"still serving")
    assert store.get("ok") == b"still serving"
    store.close()


def test_idle_connections_do_not_lock_others_out(strict: OriginServer) -> None:
    with ExitStack() as stack:
        held = [stack.enter_context(connect(strict.port)) for _ in range(200)]
        for sock in held[::2]:
            sock.sendall(HEAD[:20])  # half of them start a request and stop
        works(strict.url)
        assert strict.connection_stats["evicted"] >= 200 - 40


def test_a_trickled_request_head_is_cut(strict: OriginServer) -> None:
    with connect(strict.port) as sock:
        sock.sendall(HEAD)
        deadline = time.monotonic() + PATIENCE_S
        sock.settimeout(0.2)
        answer = b""
        while time.monotonic() < deadline and not answer:
            try:
                sock.sendall(b"X-Slow: 1\r\n")  # one header line at a time, never the end
                answer = sock.recv(4096) or b"closed"
            except socket.timeout:
                continue
            except OSError:
                answer = b"closed"
        assert answer.startswith(b"HTTP/1.1 408") or answer == b"closed", answer[:60]
    assert strict.connection_stats["slow_head"] == 1
    works(strict.url)


def test_a_stalled_upload_body_is_cut(strict: OriginServer) -> None:
    head = (
        f"PUT /o/stalled HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    with connect(strict.port) as sock:
        sock.sendall(head + b"z" * 5000)  # then nothing
        answer = answer_or_close(sock)
    assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout_s" in answer, answer[:200]
    assert not (strict.config.root / "objects" / "stalled").exists()
    works(strict.url)


def loud(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_response_nobody_reads_is_cut(strict: OriginServer, caplog: pytest.LogCaptureFixture) -> None:
    """...and the cut is one log line, without a traceback."""
    data = bytes(range(256)) * (48 << 10)  # 12 MiB: more than the sockets buffer
    open_store(strict.url, StoreConfig(token=TOKEN)).put("big", data)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    with sock:
        sock.connect(("127.0.0.1", strict.port))
        blob = f"/b/{content_hash(data)}/big"
        sock.sendall(f"GET {blob} HTTP/1.1\r\nHost: x\r\n\r\n".encode())  # never read
        wait_until(
            lambda: strict.connection_stats["stalled_write"] == 1, PATIENCE_S, "the cut of a response nobody reads"
        )
    wait_until(lambda: loud(caplog), PATIENCE_S, "the log line of the cut")
    time.sleep(0.5)  # room for any further line the cut would log
    (line,) = loud(caplog)
    assert "stalled_write" in line.getMessage() and line.exc_info is None
    works(strict.url)


def test_a_client_leaving_mid_response_logs_no_warning(strict: OriginServer, caplog: pytest.LogCaptureFixture) -> None:
    data = bytes(range(256)) * (48 << 10)
    open_store(strict.url, StoreConfig(token=TOKEN)).put("big", data)
    with connect(strict.port) as sock:
        sock.sendall(f"GET /b/{content_hash(data)}/big HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        sock.recv(1 << 16)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    works(strict.url)  # after the server saw the reset
    time.sleep(0.5)
    assert not loud(caplog), [r.getMessage() for r in loud(caplog)]


def test_a_slow_steady_reader_is_not_cut(tmp_path: Path) -> None:
    """The stall limit bounds a pause of the client's reads, not the whole transfer: a
    client that reads steadily for longer than `body_timeout_s` gets every byte."""
    config = ServerConfig(root=tmp_path / "origin", port=0, token=TOKEN, body_timeout_s=3.0)
    with OriginServer(config) as server:
        data = bytes(range(256)) * (80 << 10)  # 20 MiB: 5 s at the reader's 4 MiB/s
        open_store(server.url, StoreConfig(token=TOKEN)).put("big", data)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        with sock:
            sock.settimeout(PATIENCE_S)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(f"GET /b/{content_hash(data)}/big HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            got, t0 = 0, time.monotonic()
            while piece := _recv(sock):
                got += len(piece)
                time.sleep(max(0.0, t0 + got / (4 << 20) - time.monotonic()))
                if got >= len(data):  # the head's bytes too: the body is all there
                    break
        assert got >= len(data)
        assert server.connection_stats["stalled_write"] == 0


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(64 << 10)
    except ConnectionResetError:
        return b""


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def test_default_limits_survive_1100_idle_connections(tmp_path: Path) -> None:
    """`weight-teleport serve` with its defaults under a common open-file limit (1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1400:
        pytest.skip(f"this test opens 1,100 sockets; the open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1400), hard))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, *SERVE, "--root", str(tmp_path / "root"), "--port", str(port)],
        stderr=subprocess.PIPE,
        preexec_fn=_low_file_limit,
    )
    try:
        wait_until(lambda: proc.poll() is None and answers_http(port, "/healthz"), 60, "weight-teleport serve")
        with ExitStack() as stack:
            for _ in range(1100):
                stack.enter_context(connect(port))
            assert answers_http(port, "/healthz")
            assert open_store(f"http://127.0.0.1:{port}").get_manifest() is None
    finally:
        stop_process(proc)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert b"serving at most 480 connections" in proc.stderr.read()


def test_long_polls_leave_room_for_writes_and_probes(strict: OriginServer) -> None:
    """More anonymous long-polls than connection slots: the publisher still publishes, the
    health probe answers, and the long-polls the server held are woken by the publish."""
    writer = open_store(strict.url, StoreConfig(token=TOKEN))
    writer.put_manifest(b"version 1")
    poll = (f"GET /watch?after={manifest_etag(b'version 1')}&timeout=60 HTTP/1.1\r\nHost: x\r\n\r\n").encode()
    with ExitStack() as stack:
        polls = []
        for _ in range(60):
            before = strict.stats["watch"]
            polls.append(stack.enter_context(hold(strict, poll, lambda: strict.stats["watch"] > before)))
        assert status_of(strict.port, "/healthz") == 200
        writer.put_manifest(b"version 2")  # a refused write would raise TransportError
        answers = [response_of(sock) for sock in polls]
    woken = [body for status, headers, body in answers if status == 200]
    assert woken and all(body == b"version 2" for body in woken)
    early = [(status, headers.get("Retry-After")) for status, headers, _ in answers if status != 200]
    assert set(early) <= {(304, "1")}, early  # answered at once, told when to come back
    works(strict.url)


def test_downloads_nobody_reads_leave_room_for_writes_and_probes(tmp_path: Path) -> None:
    """More downloads that never read than connection slots, under a long stall limit:
    health probes and writes still get in."""
    config = ServerConfig(root=tmp_path / "origin", port=0, token=TOKEN, max_connections=40, body_timeout_s=60.0)
    with OriginServer(config) as server:
        data = bytes(range(256)) * (48 << 10)  # 12 MiB: more than the sockets buffer
        open_store(server.url, StoreConfig(token=TOKEN)).put("big", data)
        get = f"GET /b/{content_hash(data)}/big HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        with ExitStack() as stack:
            for _ in range(60):
                stack.enter_context(hold(server, get, lambda: False))
            assert status_of(server.port, "/healthz") == 200
            works(server.url)
            assert server.connection_stats["stalled_write"] == 0  # still held, not cut


def test_a_watch_answered_early_comes_back_when_told(strict: OriginServer) -> None:
    """A subscriber's watch whose long-poll finds no slot is answered at once: it waits as
    told (Retry-After) before it polls again, instead of polling in a loop, and still sees
    the next manifest."""
    writer = open_store(strict.url, StoreConfig(token=TOKEN))
    writer.put_manifest(b"version 1")
    etag = manifest_etag(b"version 1")
    poll = f"GET /watch?after={etag}&timeout=60 HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    with ExitStack() as stack:
        for _ in range(strict.config.max_connections):  # every slot a read may hold
            before = strict.stats["watch"]
            stack.enter_context(hold(strict, poll, lambda: strict.stats["watch"] > before))
        seen: list[bytes | None] = []
        watcher = threading.Thread(target=lambda: seen.append(open_store(strict.url).watch(etag, timeout=PATIENCE_S)))
        before = strict.stats["watch"]
        watcher.start()
        time.sleep(2.0)
        polls = strict.stats["watch"] - before
        writer.put_manifest(b"version 2")
        watcher.join(PATIENCE_S)
    assert seen == [b"version 2"]
    assert polls <= 5, f"{polls} long-polls in 2 s: polling in a loop"
