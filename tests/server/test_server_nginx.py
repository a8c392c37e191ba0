"""Fan-out through a real HTTP cache: nginx `proxy_cache` in front of the origin."""

from __future__ import annotations

import http.client
import threading
import time

from services import TOKEN, Nginx, nginx, origin  # noqa: F401
from weight_teleport.store.keys import content_hash
from weight_teleport.server import OriginServer
from weight_teleport.store import StoreConfig, manifest_etag, open_store


def get(proxy: Nginx, path: str, headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def publish(origin: OriginServer, key: str, data: bytes) -> str:
    open_store(origin.url, StoreConfig(token=TOKEN)).put(key, data)
    return f"/b/{content_hash(data)}/{key}"


def test_second_subscriber_is_served_by_the_cache(origin: OriginServer, nginx: Nginx) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    blob = publish(origin, "v/000001.pack", data)
    first, second = open_store(nginx.url), open_store(nginx.url)
    assert first.get("v/000001.pack") == data  # fills the cache
    assert second.get("v/000001.pack") == data
    assert origin.stats["blob_get"] == 1  # the origin sent the bytes once
    status, headers, body = get(nginx, blob)
    assert (status, headers["X-Cache-Status"], body) == (200, "HIT", data)
    assert headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert origin.stats["blob_get"] == 1


def test_range_requests_through_the_cache(origin: OriginServer, nginx: Nginx) -> None:
    data = bytes(range(251)) * 8000
    blob = publish(origin, "v/2", data)
    status, headers, body = get(nginx, blob, {"Range": "bytes=1000-1999"})
    assert (status, body) == (206, data[1000:2000])
    assert headers["Content-Range"] == f"bytes 1000-1999/{len(data)}"
    status, headers, body = get(nginx, blob, {"Range": "bytes=500000-"})
    assert (status, headers["X-Cache-Status"], body) == (206, "HIT", data[500000:])
    subscriber = open_store(nginx.url)
    assert subscriber.get_range("v/2", 123, 45678) == data[123:45678]
    assert origin.stats["blob_get"] == 1


def test_manifest_is_never_stale(origin: OriginServer, nginx: Nginx) -> None:
    publisher, subscriber = open_store(origin.url, StoreConfig(token=TOKEN)), open_store(nginx.url)
    publisher.put_manifest(b"v1")
    assert subscriber.get_manifest() == b"v1"
    publisher.put_manifest(b"v2")
    assert subscriber.get_manifest() == b"v2"
    assert get(nginx, "/manifest")[1]["Cache-Control"] == "no-cache"


def test_watch_through_the_cache(origin: OriginServer, nginx: Nginx) -> None:
    publisher, subscriber = open_store(origin.url, StoreConfig(token=TOKEN)), open_store(nginx.url)
    publisher.put_manifest(b"v1")
    threading.Timer(0.3, publisher.put_manifest, args=(b"v2",)).start()
    started = time.monotonic()
    assert subscriber.watch(manifest_etag(b"v1"), timeout=20) == b"v2"
    assert time.monotonic() - started < 2
    assert subscriber.watch(manifest_etag(b"v2"), timeout=0.3) is None


def test_a_replaced_object_gets_a_new_url(origin: OriginServer, nginx: Nginx) -> None:
    publisher = open_store(origin.url, StoreConfig(token=TOKEN))
    publisher.put("v/3", b"first bytes")
    assert open_store(nginx.url).get("v/3") == b"first bytes"
    publisher.delete("v/3")  # retention, then a new object under the same key
    publisher.put("v/3", b"second bytes")
    assert open_store(nginx.url).get("v/3") == b"second bytes"  # never the cached copy
