"""A hostile origin, on real sockets: bodies larger than the reader allows are refused
while they stream in, never read whole; a Range request answered with the whole object is
read no further than the range."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import numpy as np
import pytest

from weight_teleport.pipeline.errors import ObjectRejected
from weight_teleport.pipeline.fetch import fetch
from weight_teleport.format.manifest import Entry, make_entry
from weight_teleport.store import RangeIgnored, RetryConfig, StoreConfig, TooLarge, open_store
from weight_teleport.store.hashing import PIECE_BYTES

GIVE_UP = 64 << 20  # the hostile server stops sending after this many bytes
PIECE = b"\0" * (64 << 10)


class _Hostile(BaseHTTPRequestHandler):
    """Resolves every key, then answers every read with an endless body: announced by a
    huge Content-Length ("declared") or chunked ("chunked")."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.startswith("/o/"):
            self.send_response(307)
            self.send_header("Location", "/b/" + "a" * 64 + self.path[2:])
            self.send_header("X-Content-Tree-SHA256", "a" * 64)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        chunked = self.server.mode == "chunked"  # type: ignore[attr-defined]
        self.send_header(*(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(1 << 40))))
        self.end_headers()
        try:
            while self.server.sent < GIVE_UP:  # type: ignore[attr-defined]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(PIECE), PIECE) if chunked else PIECE)
                self.server.sent += len(PIECE)  # type: ignore[attr-defined]
        except OSError:  # the client hung up: what it should do
            pass
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=["declared", "chunked"])
def hostile(request: pytest.FixtureRequest) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.mode, server.sent = request.param, 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_an_object_larger_than_allowed_is_cut_short(hostile: ThreadingHTTPServer) -> None:
    store = open_store(_url(hostile))
    with pytest.raises(TooLarge, match="1000 bytes"):
        store.get("packs/1.pack", max_bytes=1000)
    assert hostile.sent < GIVE_UP // 2  # what the sockets buffered, not the whole body


def test_fetch_reads_no_more_than_the_manifest_says(hostile: ThreadingHTTPServer) -> None:
    entry = make_entry(1, "snapshot", None, b"x" * 1000, 1000)
    with pytest.raises(ObjectRejected, match="manifest says 1000"):
        fetch(open_store(_url(hostile)), entry)
    assert hostile.sent < GIVE_UP // 2


def test_an_endless_manifest_is_refused(hostile: ThreadingHTTPServer) -> None:
    store = open_store(_url(hostile), StoreConfig(max_manifest_bytes=1 << 20))
    with pytest.raises(TooLarge, match="max_manifest_bytes"):
        store.get_manifest()
    with pytest.raises(TooLarge, match="max_manifest_bytes"):
        store.watch(None, timeout=5)
    assert hostile.sent < GIVE_UP // 2


def test_a_range_answered_whole_is_read_no_further(hostile: ThreadingHTTPServer) -> None:
    """A cache, a proxy or a hostile origin answers a Range request with 200 and the whole
    (here endless) object: a range from byte 0 is its first bytes, any other is refused."""
    store = open_store(_url(hostile), StoreConfig(retry=RetryConfig(attempts=1)))
    assert store.get_range("packs/1.pack", 0, 1) == b"\0"
    out = np.ones(1000, np.uint8)
    assert store.get_range_into("packs/1.pack", 0, out) == 1000 and not out.any()
    with pytest.raises(RangeIgnored, match="whole object"):
        store.get_range("packs/1.pack", 10, 20)
    with pytest.raises(RangeIgnored, match="whole object"):
        store.get_range_into("packs/1.pack", 10, out)
    assert hostile.sent < GIVE_UP // 2


def test_a_large_fetch_answered_whole_is_refused(hostile: ThreadingHTTPServer) -> None:
    """A 64 MiB entry fetched in ranges from an origin that answers each with everything."""
    entry = Entry(1, "snapshot", None, "packs/1.pack", 64 << 20, "0" * 64, piece_bytes=PIECE_BYTES)
    with pytest.raises(RangeIgnored):
        fetch(open_store(_url(hostile), StoreConfig(retry=RetryConfig(attempts=1))), entry)
    assert hostile.sent < GIVE_UP // 2
