"""The origin server over raw HTTP: auth, names, sizes, ranges, headers, long-poll."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from services import TOKEN, answers_http, free_port, origin, stop_process, wait_until  # noqa: F401
from weight_teleport.store.keys import content_hash
from weight_teleport.server import OriginServer, ServerConfig
from weight_teleport.store import AuthError, StoreConfig, TooLarge, manifest_etag, open_store
from weight_teleport.store.file import FileStore

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def request(
    server: OriginServer, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.headers), resp.read()
    finally:
        conn.close()


def raw_request(port: int, data: bytes) -> bytes:
    """Send bytes as they are (no URL normalisation) and return the raw answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        return s.recv(4096)


def stored_files(server: OriginServer) -> list[str]:
    root = server.config.root
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_uploads_need_the_token(origin: OriginServer) -> None:
    assert request(origin, "PUT", "/o/k", b"x")[0] == 401
    assert request(origin, "PUT", "/o/k", b"x", {"Authorization": "Bearer nope"})[0] == 403
    assert request(origin, "PUT", "/manifest", b"m", {"Authorization": "Basic x"})[0] == 401
    assert request(origin, "DELETE", "/o/k")[0] == 401
    assert stored_files(origin) == []
    with pytest.raises(AuthError):
        open_store(origin.url, StoreConfig(token="wrong")).put("k", b"x")
    assert request(origin, "PUT", "/o/k", b"x", AUTH)[0] == 201


def test_without_a_token_uploads_are_off(tmp_path: Path) -> None:
    with OriginServer(ServerConfig(root=tmp_path, port=0)) as server:
        assert request(server, "PUT", "/o/k", b"x", AUTH)[0] == 403


@pytest.mark.parametrize(
    "path",
    [
        "/o/..%2F..%2Fescape",
        "/o/%2e%2e/escape",
        "/o/a/%2E%2E/%2E%2E/x",
        "/o/%2Fetc%2Fpasswd",
        "/o/.hidden",
        "/o/a%5C..%5Cb",
    ],
)
def test_names_outside_the_root_are_refused(origin: OriginServer, path: str) -> None:
    assert request(origin, "PUT", path, b"x", AUTH)[0] == 400
    assert request(origin, "GET", path)[0] == 400
    assert stored_files(origin) == []
    assert not (origin.config.root.parent / "escape").exists()


def test_raw_dot_segments_never_reach_a_file(origin: OriginServer) -> None:
    (origin.config.root / "manifest").write_bytes(b"m")  # something to find at root
    for target in ["/o/../manifest", "/b/../../manifest", "/o/a/../../../etc/passwd"]:
        answer = raw_request(origin.port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 400"), (target, answer[:80])


def test_oversized_uploads_are_refused(origin: OriginServer) -> None:
    limit = origin.config.max_object_bytes
    status, _, body = request(origin, "PUT", "/o/big", b"x" * (limit + 1), AUTH)
    assert status == 413 and b"limit" in body
    with pytest.raises(TooLarge), open_store(origin.url, StoreConfig(token=TOKEN)) as store:
        store.put("big", b"x" * (limit + 1))

    def chunked():  # no Content-Length: refused while streaming
        for _ in range(limit // (1 << 20) + 2):
            yield b"y" * (1 << 20)

    conn = http.client.HTTPConnection("127.0.0.1", origin.port, timeout=30)
    conn.request("PUT", "/o/big", body=chunked(), headers=AUTH, encode_chunked=True)
    assert conn.getresponse().status == 413
    conn.close()
    assert request(origin, "PUT", "/manifest", b"m" * (2 << 20), AUTH)[0] == 413
    assert stored_files(origin) == []


def test_disconnect_mid_upload_leaves_nothing(origin: OriginServer) -> None:
    head = (
        f"PUT /o/cut HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", origin.port)) as s:
        s.sendall(head + b"z" * 5000)
        time.sleep(0.2)
    time.sleep(0.3)
    assert request(origin, "GET", "/o/cut")[0] == 404
    assert stored_files(origin) == []


def test_corrupted_upload_is_refused(origin: OriginServer) -> None:
    headers = {**AUTH, "X-Content-Tree-SHA256": content_hash(b"other")}
    assert request(origin, "PUT", "/o/k", b"data", headers)[0] == 400
    assert stored_files(origin) == []


def test_objects_are_content_addressed_and_immutable(origin: OriginServer) -> None:
    data = bytes(range(256)) * 100
    digest = content_hash(data)
    assert request(origin, "PUT", "/o/v/1", data, AUTH)[0] == 201
    assert request(origin, "PUT", "/o/v/1", data, AUTH)[0] == 200
    assert request(origin, "PUT", "/o/v/1", b"other", AUTH)[0] == 409
    status, headers, _ = request(origin, "GET", "/o/v/1")
    assert status == 307 and headers["X-Content-Tree-SHA256"] == digest
    assert headers["Location"] == f"../../b/{digest}/v/1"
    assert headers["Cache-Control"] == "no-cache"
    status, headers, body = request(origin, "GET", f"/b/{digest}/v/1")
    assert (status, body) == (200, data)
    assert headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert headers["ETag"] == f'"{digest}"'
    revalidate = {"If-None-Match": f'"{digest}"'}
    assert request(origin, "GET", f"/b/{digest}/v/1", headers=revalidate)[0] == 304
    assert request(origin, "GET", f"/b/{'0' * 64}/v/1")[0] == 404
    assert request(origin, "GET", "/b/not-a-hash/v/1")[0] == 400


def test_range_requests(origin: OriginServer) -> None:
    data = bytes(range(256)) * 10
    digest = content_hash(data)
    request(origin, "PUT", "/o/r", data, AUTH)
    url = f"/b/{digest}/r"
    status, headers, body = request(origin, "GET", url, headers={"Range": "bytes=10-19"})
    assert (status, body) == (206, data[10:20])
    assert headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    assert request(origin, "GET", url, headers={"Range": "bytes=2500-"})[2] == data[2500:]
    assert request(origin, "GET", url, headers={"Range": "bytes=-7"})[2] == data[-7:]
    assert request(origin, "GET", url, headers={"Range": "bytes=9000-9999"})[0] == 416
    assert request(origin, "GET", url, headers={"Range": "lines=1-2"})[0] == 400


def test_manifest_headers(origin: OriginServer) -> None:
    assert request(origin, "GET", "/manifest")[0] == 404
    assert request(origin, "PUT", "/manifest", b"m1", AUTH)[0] == 204
    status, headers, body = request(origin, "GET", "/manifest")
    etag = f'"{manifest_etag(b"m1")}"'
    assert (status, body, headers["ETag"]) == (200, b"m1", etag)
    assert headers["Cache-Control"] == "no-cache"
    assert request(origin, "GET", "/manifest", headers={"If-None-Match": etag})[0] == 304


def test_watch_long_poll(origin: OriginServer) -> None:
    assert request(origin, "GET", "/watch?timeout=0.1")[0] == 204  # no manifest
    request(origin, "PUT", "/manifest", b"m1", AUTH)
    etag = manifest_etag(b"m1")
    assert request(origin, "GET", f"/watch?after={etag}&timeout=0.1")[0] == 304
    assert request(origin, "GET", "/watch?after=x&timeout=0")[2] == b"m1"
    assert request(origin, "GET", "/watch?timeout=soon")[0] == 400
    assert request(origin, "GET", "/watch?timeout=-1")[0] == 400
    threading.Timer(0.3, request, args=(origin, "PUT", "/manifest", b"m2", AUTH)).start()
    started = time.monotonic()
    status, headers, body = request(origin, "GET", f"/watch?after={etag}&timeout=20")
    assert (status, body) == (200, b"m2") and time.monotonic() - started < 2


def test_watch_sees_writers_that_bypass_the_server(origin: OriginServer) -> None:
    direct = FileStore(origin.config.root)  # a publisher writing the directory itself
    direct.put_manifest(b"m1")
    threading.Timer(0.2, direct.put_manifest, args=(b"m2",)).start()
    started = time.monotonic()
    store = open_store(origin.url)
    assert store.watch(manifest_etag(b"m1"), timeout=20) == b"m2"
    assert time.monotonic() - started < 2
    direct.put("v/1", b"abc")
    assert store.get("v/1") == b"abc" and store.list() == ["v/1"]


def test_serve_command(tmp_path: Path) -> None:
    """`serve --port 0` says where it listens (the port bound), the root, and who may
    upload and read."""
    token_file = tmp_path / "token"
    token_file.write_text("file-token\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "weight_teleport.cli",
            "serve",
            "--root",
            str(tmp_path / "root"),
            "--port",
            "0",
            "--token-file",
            str(token_file),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        said = [proc.stdout.readline() for _ in range(4)]
        url = said[0].split()[-1]
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0"), said
        assert str((tmp_path / "root").resolve()) in said[1]
        assert "need the upload token" in said[2] and "open to anyone" in said[3]
        store = open_store(url, StoreConfig(token="file-token"))
        store.put("k", b"v")
        assert store.get("k") == b"v"
        assert (tmp_path / "root" / "objects" / "k").read_bytes() == b"v"
    finally:
        stop_process(proc)


def test_key_used_as_directory_conflicts(origin: OriginServer) -> None:
    assert request(origin, "PUT", "/o/a", b"1", AUTH)[0] == 201
    assert request(origin, "PUT", "/o/b/c", b"2", AUTH)[0] == 201
    assert request(origin, "PUT", "/o/a/x", b"3", AUTH)[0] == 409
    assert request(origin, "PUT", "/o/b", b"3", AUTH)[0] == 409
    assert request(origin, "GET", "/o/b")[0] == 404
    assert request(origin, "DELETE", "/o/b", headers=AUTH)[0] == 404
    assert stored_files(origin) == ["objects/a", "objects/b/c"]
