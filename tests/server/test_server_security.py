"""Who may read, and hostile or unlucky requests: read tokens, TLS (the origin's own and
nginx in front), a non-ASCII Authorization header, an overlong key, a full disk."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from services import (
    NGINX_HTTP,
    TOKEN,
    answers_http,
    free_port,
    origin,  # noqa: F401 (fixture)
    run_nginx,
    self_signed_cert,
    stop_process,
    wait_until,
)
from weight_teleport.server import OriginServer, ServerConfig
from weight_teleport.store import (
    AuthError,
    RetryConfig,
    StoreConfig,
    StoreError,
    StoreFull,
    TransportError,
    manifest_etag,
    open_store,
)
from weight_teleport.store.file import FileStore

READ = "test-read-token"


def status_of(
    port: int, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def raw_status(port: int, head: bytes) -> bytes:
    """The status line answered to a request sent byte for byte."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        return s.recv(4096).split(b"\r\n", 1)[0]


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[OriginServer]:
    """An origin whose reads need READ (or the upload token)."""
    config = ServerConfig(root=tmp_path / "origin", port=0, token=TOKEN, read_token=READ)
    with OriginServer(config) as server:
        writer = open_store(server.url, StoreConfig(token=TOKEN))
        writer.put("v/1", b"weights")
        writer.put_manifest(b"m1")
        yield server


def test_reads_need_the_read_token(guarded: OriginServer) -> None:
    port, bearer = guarded.port, lambda t: {"Authorization": f"Bearer {t}"}
    for path in ["/manifest", "/o/v/1", "/list", "/watch?timeout=0"]:
        assert status_of(port, "GET", path)[0] == 401, path
        assert status_of(port, "GET", path, bearer("nope"))[0] == 403, path
    assert status_of(port, "GET", "/manifest", bearer(READ)) == (200, b"m1")
    assert status_of(port, "GET", "/manifest", bearer(TOKEN)) == (200, b"m1")  # uploads read
    assert status_of(port, "GET", "/healthz")[0] == 200
    reader = open_store(guarded.url, StoreConfig(read_token=READ))
    assert reader.get("v/1") == b"weights" and reader.list() == ["v/1"]
    assert reader.watch(manifest_etag(b"m0"), timeout=5) == b"m1"
    with pytest.raises(AuthError, match="--read-token-file.*WEIGHT_TELEPORT_READ_TOKEN.*StoreConfig\\(read_token"):
        open_store(guarded.url).get_manifest()
    with pytest.raises(AuthError, match="--token-file.*WEIGHT_TELEPORT_TOKEN.*StoreConfig\\(token"):
        open_store(guarded.url, StoreConfig(token=READ)).put("v/2", b"x")  # reads only


def test_a_non_ascii_authorization_header_is_400(origin: OriginServer) -> None:
    for head in [
        b"PUT /manifest HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
        b"Content-Length: 1\r\n\r\nx",  # not even UTF-8
        b"PUT /o/k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\xc3\xb6ken\r\nContent-Length: 1\r\n\r\nx",
    ]:
        assert raw_status(origin.port, head) == b"HTTP/1.1 400 Bad Request"


def test_a_key_segment_longer_than_a_file_name_is_400(origin: OriginServer) -> None:
    path = "/o/v/" + "s" * 300
    status, body = status_of(origin.port, "PUT", path, {"Authorization": f"Bearer {TOKEN}"}, b"x")
    assert status == 400 and b"at most 255" in body
    assert status_of(origin.port, "GET", path)[0] == 400


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB filesystem (tmpfs), to fill up."""
    d = tmp_path / "tiny"
    d.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("mounting a small tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=True)


def test_a_full_disk_is_507_and_leaves_nothing(tiny_disk: Path) -> None:
    big = b"w" * (2 << 20)
    with OriginServer(ServerConfig(root=tiny_disk, port=0, token=TOKEN)) as server:
        status, body = status_of(server.port, "PUT", "/o/big", {"Authorization": f"Bearer {TOKEN}"}, big)
        assert status == 507 and b"disk is full" in body
        store = open_store(server.url, StoreConfig(token=TOKEN))
        with pytest.raises(StoreFull, match="507"):
            store.put("big", big)
        assert [p.name for p in tiny_disk.rglob("*") if p.is_file()] == [], "temp files left"
        store.put("small", b"fits")  # the space of the failed uploads is free again
        assert store.get("small") == b"fits"
    with pytest.raises(StoreFull, match="no space left"):
        FileStore(tiny_disk).put("big", big)


def _https_get(port: int, context: ssl.SSLContext) -> bool:
    try:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=context)
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        return True
    except OSError:
        return False


def test_tls_origin(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    config = ServerConfig(root=tmp_path / "origin", port=0, token=TOKEN, tls_cert_file=cert, tls_key_file=key)
    with OriginServer(config) as server:
        assert server.url.startswith("https://")
        store = open_store(server.url, StoreConfig(token=TOKEN, ca_file=str(cert)))
        store.put("v/1", b"secret weights")
        store.put_manifest(b"m1", if_match=None)
        assert store.get("v/1") == b"secret weights"
        assert store.watch(None, timeout=5) == b"m1"
        with pytest.raises(StoreError, match="certificate was not verified.*--ca-file"):
            open_store(server.url).get_manifest()  # the system's authorities do not know it
        with pytest.raises(TransportError):
            open_store(server.url.replace("https", "http"), StoreConfig(retry=RetryConfig(attempts=1))).get_manifest()


_NGINX_TLS = (
    NGINX_HTTP
    + """    # The cache serves its copies itself: it checks the tokens the origin would.
    map $http_authorization $reader {{
        default 0;
        "Bearer {read}" 1;
        "Bearer {upload}" 1;
    }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        client_max_body_size 0;
        location = /healthz {{
            proxy_pass http://127.0.0.1:{upstream};
        }}
        location / {{
            if ($reader = 0) {{
                return 401 "a bearer token is needed\\n";
            }}
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache weights;
            proxy_cache_lock on;
            proxy_read_timeout 120s;
            proxy_request_buffering off;
            add_header X-Cache-Status $upstream_cache_status always;
        }}
    }}
}}
"""
)


def test_tls_terminated_by_nginx(guarded: OriginServer, tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    d, port = tmp_path / "nginx", free_port()
    trust = ssl.create_default_context(cafile=str(cert))
    conf = _NGINX_TLS.format(d=d, port=port, upstream=guarded.port, cert=cert, key=key, read=READ, upload=TOKEN)
    with run_nginx(d, conf, port, ready=lambda: _https_get(port, trust)):
        url = f"https://127.0.0.1:{port}"
        reader = open_store(url, StoreConfig(read_token=READ, ca_file=str(cert)))
        assert reader.get("v/1") == b"weights"  # fills the cache
        assert open_store(url, StoreConfig(read_token=READ, ca_file=str(cert))).get("v/1") == b"weights"
        assert guarded.stats["blob_get"] == 1  # the second read came from the cache
        with pytest.raises(AuthError):
            open_store(url, StoreConfig(ca_file=str(cert))).get("v/1")  # nor from the cache
        writer = open_store(url, StoreConfig(token=TOKEN, ca_file=str(cert)))
        writer.put_manifest(b"m2", if_match=manifest_etag(b"m1"))
        assert reader.get_manifest() == b"m2"


def test_serve_command_with_tls_and_a_read_token(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    port, read_file = free_port(), tmp_path / "read-token"
    read_file.write_text(READ + "\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "weight_teleport.cli",
            "serve",
            "--root",
            str(tmp_path / "root"),
            "--port",
            str(port),
            "--read-token-file",
            str(read_file),
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
        ],
        env={**os.environ, "WEIGHT_TELEPORT_TOKEN": "env-token"},
    )
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        wait_until(lambda: proc.poll() is None and _https_get(port, trust), 60, "weight-teleport serve --tls-cert")
        url = f"https://127.0.0.1:{port}"
        open_store(url, StoreConfig(token="env-token", ca_file=str(cert))).put("k", b"v")
        assert open_store(url, StoreConfig(read_token=READ, ca_file=str(cert))).get("k") == b"v"
        with pytest.raises(AuthError):
            open_store(url, StoreConfig(ca_file=str(cert))).get("k")
        assert not answers_http(port, "/healthz")  # no plain HTTP
    finally:
        stop_process(proc)
