"""The SGLang loader without SGLang (it cannot run here): control messages through the
pickler SGLang uses, read back under SGLang 0.5.23's unpickler allowlist; the loader never
raises; two real gloo ranks with parameters in SGLang's (= vLLM's) TP=2 layout follow a real
file store, commit a version on both, skip one that a held rank lacks, then apply it; and
`SglangEngine`'s HTTP calls against a stand-in that answers SGLang's weight-update routes
as SGLang 0.5.23 does (sessions included), or as SGLang before 0.5.21 does."""

import io
import json
import multiprocessing as mp
import pickle
import socket
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from weight_teleport.targets import sglang as S


SGLANG_ALLOWED = {
    ("builtins", "list"),
    ("builtins", "tuple"),
    ("torch", "Tensor"),
    ("torch", "Size"),
    ("torch", "float32"),
    ("torch.storage", "UntypedStorage"),
    *(
        ("torch.multiprocessing.reductions", f)
        for f in (
            "rebuild_tensor",
            "rebuild_meta_tensor",
            "rebuild_storage_empty",
            "rebuild_storage_fd",
            "rebuild_storage_filename",
            "rebuild_typed_storage",
        )
    ),
    *(("torch._utils", f) for f in ("_rebuild_tensor", "_rebuild_tensor_v2")),
}
"""Globals that SGLang 0.5.23's weight-payload unpickler (`SafeUnpickler.ALLOWED_GLOBALS`
in sglang/srt/utils/common.py, an exact list) admits, among those a tensor pickled by
torch's ForkingPickler can name; it refuses every other global."""


class _SglangUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in SGLANG_ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"blocked {module}.{name}")


def _decode(payload: str) -> list:
    import base64

    return _SglangUnpickler(io.BytesIO(base64.b64decode(payload, validate=True))).load()


def test_control_messages_round_trip_small():
    engine = S.SglangEngine("http://127.0.0.1:1", tp_size=8)
    body = engine.request(S.control("update", version=123456, wait_s=30.0), flush_cache=True)
    assert len(body) < 4096  # all that crosses to the server in the pause, for 8 ranks
    payloads = json.loads(body)["serialized_named_tensors"]
    assert len(payloads) == 8
    assert S.parse(_decode(payloads[0])) == {"command": "update", "version": 123456, "wait_s": 30.0}


@pytest.mark.parametrize(
    "named",
    [
        [("model.norm.weight", torch.ones(4))],
        [(S.PREFIX + '{"command": "update", "version": 1}', torch.ones(1))],
        [(S.PREFIX + '{"command": "drop"}', torch.empty(0))],
        [(S.PREFIX + "[1]", torch.empty(0))],
        [],
    ],
)
def test_loader_refuses_what_is_not_a_control_message_without_raising(named):
    with pytest.raises(ValueError):
        S.parse(named)
    S.teleport_loader(torch.nn.Linear(2, 2), named)  # logged, never raised: SGLang would go down


def _module(params: dict, config: dict) -> torch.nn.Module:
    root = torch.nn.Module()
    for name, t in params.items():
        *path, leaf = name.split(".")
        m = root
        for part in path:
            if not hasattr(m, part):
                m.add_module(part, torch.nn.Module())
            m = getattr(m, part)
        m.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
    root.config = config
    return root


def _wait_staged(worker, version: int) -> None:
    deadline = time.monotonic() + 120
    while version not in worker.status()["staged_at"]:
        assert time.monotonic() < deadline, worker.status()
        time.sleep(0.05)


def _rank(rank: int, port: int, url: str, status_dir: str, states: list) -> None:
    import torch.distributed as dist

    from test_slice_stage import CONFIG, engine_params
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import Publisher
    from weight_teleport.targets.vllm_layout import slice_hints

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    S._tp_group = lambda: (rank, 2, None)
    model = _module(engine_params(states[0], rank), CONFIG)
    send = lambda command, **f: S.teleport_loader(model, S.control(command, **f))  # noqa: E731
    pub = Publisher(url, PublisherConfig(hints=slice_hints(CONFIG, [2]), threads=1)) if rank == 0 else None
    if pub:
        pub.publish(states[0], version=0).wait()
        pub.publish(states[1], version=1).wait()
    dist.barrier()
    send("init", init_info={"store_url": url, "initial_version": 0, "watch_timeout_s": 0.1}, status_dir=status_dir)
    worker = S._workers[id(model)][0]
    _wait_staged(worker, 1)
    send("update", version=1, wait_s=60.0)
    send("hold", ranks=[1], on=True)
    dist.barrier()
    if pub:
        pub.publish(states[2], version=2).wait()
        _wait_staged(worker, 2)
    send("update", version=2, wait_s=1.0)  # rank 1 holds: skipped on both
    send("hold", ranks=[1], on=False)
    send("update", version=2, wait_s=60.0)
    want = engine_params(states[2], rank)
    for name, p in dict(model.named_parameters()).items():
        assert torch.equal(p.data.view(torch.int16), want[name].view(torch.int16)), (rank, name)
    worker.shutdown()
    if pub:
        pub.close()
    dist.destroy_process_group()


def test_two_ranks_commit_through_the_loader(tmp_path):
    from test_slice_stage import _mutate, _state

    gen = torch.Generator().manual_seed(0)
    states = [_state(gen)]
    states += [_mutate(states[-1], 0.03, gen) for _ in range(2)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    url, status_dir = f"file://{tmp_path}/store", str(tmp_path / "status")
    procs = [ctx.Process(target=_rank, args=(r, port, url, status_dir, states)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0]
    engine = S.SglangEngine("http://127.0.0.1:1", tp_size=2, status_dir=status_dir)
    status = engine.status()
    assert [s["outcomes"] for s in status] == [[[1, "APPLIED"], [2, "SKIPPED"], [2, "APPLIED"]]] * 2


@contextmanager
def _sglang(seen: list, sessions: bool = True, refuse: list | None = None, key: str | None = None):
    """An HTTP server answering SGLang's weight-update routes as SGLang 0.5.23 does, or
    with `sessions` false as SGLang before 0.5.21 (no session routes: 404): an update
    outside a session, a second begin and an end without one are refused (400), as is the
    next call of each route in `refuse`; with a `key`, a request without it (401). Yields
    its URL and its session state."""
    state, refuse = {"open": False}, refuse or []

    class Server(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                return self._reply(401, {"error": "Unauthorized"})
            if not sessions and self.path in ("/begin_weight_update", "/end_weight_update"):
                return self._reply(404, {"detail": "Not Found"})
            ok = self.path not in refuse
            if not ok:
                refuse.remove(self.path)
            if self.path == "/begin_weight_update":
                ok = ok and not state["open"]
                state["open"] = state["open"] or ok
            elif self.path == "/end_weight_update":
                ok = ok and state["open"]
                state["open"] = state["open"] and not ok
            elif self.path == "/update_weights_from_tensor":
                ok = ok and (state["open"] or not sessions)
            self._reply(200 if ok else 400, {"success": ok, "message": "" if ok else "refused"})

        def _reply(self, code: int, body: dict) -> None:
            self.send_response(code)
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args):
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Server) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{httpd.server_port}", state
        finally:
            httpd.shutdown()


def _ranks_report(status_dir, version: int, outcome: str) -> None:
    for rank in range(2):
        (status_dir / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "outcomes": [[version, outcome]]}))


SESSION = ["/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update"]


def test_update_flushes_the_cache_and_labels_an_applied_version(tmp_path):
    """`SglangEngine.update` sends each control message inside a weight-update session, for
    the target model, asks SGLang to flush its radix cache with every update, and sets
    SGLang's weight version, without aborting requests, once every rank reports it APPLIED."""
    seen, status_dir = [], tmp_path / "status"
    status_dir.mkdir()
    with _sglang(seen) as (url, state):
        engine = S.SglangEngine(url, tp_size=2, status_dir=str(status_dir))
        _ranks_report(status_dir, 3, "SKIPPED")
        assert engine.update(3) == "SKIPPED"
        _ranks_report(status_dir, 3, "APPLIED")
        assert engine.update(3) == "APPLIED"
        assert not state["open"]
    assert [path for path, _ in seen] == SESSION * 2 + ["/update_weight_version"]
    updates = [body for path, body in seen if path == "/update_weights_from_tensor"]
    assert all(
        b["flush_cache"] and b["load_format"] == S.LOADER and b["selector"] == "target" and b["disable_draft_model"]
        for b in updates
    )
    assert all(body == {"selector": "target"} for path, body in seen if path == "/begin_weight_update")
    assert seen[-1][1] == {"new_version": "3", "abort_all_requests": False}  # SGLang's default aborts


def test_a_server_without_sessions_takes_the_update_alone():
    seen = []
    with _sglang(seen, sessions=False) as (url, _):
        S.SglangEngine(url, tp_size=2).hold([1], True)
    assert [path for path, _ in seen] == ["/begin_weight_update", "/update_weights_from_tensor"]


def test_a_refused_update_closes_its_session():
    seen = []
    with _sglang(seen, refuse=["/update_weights_from_tensor"]) as (url, state):
        engine = S.SglangEngine(url, tp_size=2)
        with pytest.raises(S.SglangUpdateError, match="refused"):
            engine.update(4)
        assert not state["open"]
        engine.hold([0], False)  # the next request opens a session of its own
    assert [path for path, _ in seen] == SESSION * 2


def test_a_server_with_a_key_takes_requests_that_carry_it():
    seen = []
    with _sglang(seen, key="admin-key") as (url, _):
        with pytest.raises(S.SglangUpdateError, match="401"):
            S.SglangEngine(url, tp_size=2).hold([1], True)
        S.SglangEngine(url, tp_size=2, api_key="admin-key").hold([1], True)
    assert [path for path, _ in seen] == ["/begin_weight_update"] + SESSION
