"""Mistyped store URLs and broken stores must fail with a message that says what is wrong,
never look like an empty store."""

from __future__ import annotations

import pytest

from services import free_port, origin  # noqa: F401 (fixture)
from weight_teleport.cli import main
from weight_teleport.store import StoreError, open_store
from weight_teleport.store.config import RetryConfig, StoreConfig


@pytest.mark.parametrize("path", ["/status", "/status.json", "/metrics"])
def test_the_address_of_an_origin_page_is_not_a_store(origin, capsys, path) -> None:  # noqa: F811
    assert main(["status", origin.url + path]) == 1
    err = capsys.readouterr().err
    assert "not of the store" in err and f"use {origin.url.rstrip('/')}" in err


def test_an_address_that_is_no_origin_is_refused(origin, capsys) -> None:  # noqa: F811
    assert main(["status", origin.url.rstrip("/") + "/weights"]) == 1
    assert "is not the address of a weight-teleport origin" in capsys.readouterr().err


def test_an_empty_origin_says_nothing_was_published(origin, capsys) -> None:  # noqa: F811
    assert main(["status", origin.url]) == 0
    assert "nothing was published there yet" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["file", "origin"])
def test_status_of_a_corrupt_manifest_fails(where, tmp_path, capsys, request) -> None:
    if where == "file":
        url, root = f"file://{tmp_path}/store", tmp_path / "store"
        root.mkdir()
    else:
        url, root = request.getfixturevalue("origin").url, tmp_path / "origin"
    (root / "manifest").write_bytes(b'{"format": 1, "entries": [{"version": ')
    assert main(["status", url]) == 1
    captured = capsys.readouterr()
    assert "manifest" in captured.out + captured.err


def test_a_file_url_one_slash_short_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=r"three slashes \(file:///tmp/store\)"):
        open_store("file://tmp/store")
    assert not (tmp_path / "tmp").exists()
    open_store("file://./tmp/store").put("k", b"v")
    assert (tmp_path / "tmp" / "store" / "objects" / "k").read_bytes() == b"v"


def test_a_refused_connection_asks_whether_the_origin_runs() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    store = open_store(url, StoreConfig(retry=RetryConfig(attempts=1)))
    with pytest.raises(StoreError, match=f"connection refused: is the origin running at {url}"):
        store.get_manifest()
