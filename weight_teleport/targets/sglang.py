"""weight-teleport in SGLang: each tensor-parallel worker follows the store and stages its
own slice (the design of `targets/vllm_backend.py`); the pause is one small weight-update
request, "apply version V", committed across the TP group.

UNTESTED AGAINST A REAL SGLANG. SGLang does not run on the CPU machines this project is
built and tested on (it needs a CUDA build of torch, flashinfer and sglang-kernel). This
module is written against SGLang's documented API: `--custom-weight-loader`, and
`/update_weights_from_tensor` (also `Engine.update_weights_from_tensor`) with `load_format`
naming that loader, on which SGLang's `ModelRunner.update_weights_from_tensor` calls
`loader(model, named_tensors)` in every TP worker. What is tested here, without SGLang
(tests/test_sglang_worker.py): the control messages through the pickler SGLang uses, the
loader's dispatch, and the cross-rank commit on real gloo process groups with parameters in
SGLang's layout.

    python -m sglang.launch_server --model-path MODEL --tp-size N \\
        --custom-weight-loader weight_teleport.targets.sglang.teleport_loader

    engine = SglangEngine("http://127.0.0.1:30000", tp_size=N)
    engine.init({"store_url": "http://origin:8000", "initial_version": 0})
    ...                        # every worker stages the versions it finds, while SGLang serves
    engine.update(7)           # the pause: one request of well under 4 KiB

Control messages travel as the name of one named tensor whose tensor is empty: torch pickles
an empty tensor by value (no shared memory), so a request carries no weights and the caller
need not share the server's host. The loader runs in each worker's scheduler between
batches, so applying there never races a forward pass.

Layouts: SGLang's dense decoders (Llama, Qwen2, Qwen3, Mistral) keep vLLM's parallel layers
and names (fused qkv_proj / gate_up_proj, row-parallel o_proj / down_proj, vocabularies
padded to 64 and split by rows), so `vllm_layout.worker_slices` maps them.

Outcomes: SGLang's scheduler does not catch an exception from a weight loader (the server
goes down), so the loader never raises: each rank logs every outcome and keeps it in its
status; where `init` names a `status_dir` (a directory on the server's host), every rank
writes `rank{N}.json` there after each request, and `SglangEngine.update` returns the
group's outcome from those files."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import urllib.error
import urllib.request
from multiprocessing.reduction import ForkingPickler

import torch

from weight_teleport.errors import WeightTeleportError
from weight_teleport.targets.vllm_layout import worker_slices
from weight_teleport.targets.worker_local import TeleportInitInfo, TeleportUpdateInfo, WorkerLocal

LOADER = "weight_teleport.targets.sglang.teleport_loader"
"""Pass to `sglang.launch_server --custom-weight-loader`; the `load_format` of every request."""
PREFIX = "weight_teleport:"
COMMANDS = ("init", "update", "hold", "status")
_log = logging.getLogger(__name__)
_workers: dict[int, tuple[WorkerLocal, str | None]] = {}
"""id(model) -> (its WorkerLocal, its status directory): one per model in this process."""


class SglangUpdateError(WeightTeleportError, RuntimeError):
    """The SGLang server refused a weight-update request; its message says why."""


def control(command: str, **fields) -> list[tuple[str, torch.Tensor]]:
    """A control message as SGLang's named tensors: one name, one empty tensor."""
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}; known: {', '.join(COMMANDS)}")
    return [(PREFIX + json.dumps({"command": command, **fields}, separators=(",", ":")), torch.empty(0))]


def serialize(named: list) -> str:
    """What SGLang's `MultiprocessingSerializer.serialize(named, output_str=True)` makes:
    base64 of torch's ForkingPickler (here without importing SGLang)."""
    import torch.multiprocessing  # noqa: F401  (registers torch's reductions with ForkingPickler)

    buf = io.BytesIO()
    ForkingPickler(buf).dump(named)
    return base64.b64encode(buf.getvalue()).decode()


def parse(named: list) -> dict:
    """The command of a control message; ValueError for anything else."""
    if len(named) != 1 or not isinstance(named[0][0], str) or not named[0][0].startswith(PREFIX):
        raise ValueError("expected one weight-teleport control message; this loader takes no weights")
    if getattr(named[0][1], "numel", lambda: 1)() != 0:
        raise ValueError("a control message's tensor must be empty")
    command = json.loads(named[0][0][len(PREFIX):])
    if not isinstance(command, dict) or command.get("command") not in COMMANDS:
        raise ValueError(f"unknown control message {named[0][0][:200]!r}")
    return command


def _tp_group() -> tuple[int, int, object]:
    """(rank, size, CPU process group) of this worker's TP group, from SGLang (the tests
    set a plain gloo group here)."""
    from sglang.srt.distributed import get_tp_group

    group = get_tp_group()
    return group.rank_in_group, group.world_size, group.cpu_group


def _worker(model: torch.nn.Module) -> WorkerLocal:
    if id(model) not in _workers:
        rank, size, group = _tp_group()
        params = lambda: {n: p.data for n, p in model.named_parameters()}  # noqa: E731
        device = next(model.parameters()).device
        _workers[id(model)] = (WorkerLocal(params, worker_slices(model.config, size, rank), rank, group, device),
                               None)
    return _workers[id(model)][0]


def teleport_loader(model: torch.nn.Module, named_tensors: list) -> None:
    """SGLang custom weight loader: run one control message on this worker. Never raises
    (see the module docstring): a bad message or a failed call is logged."""
    try:
        command = parse(named_tensors)
        worker = _worker(model)
        _run(model, worker, command)
    except Exception:
        _log.exception("weight-teleport: a control message failed on this worker")
        return
    status_dir = _workers[id(model)][1]
    if status_dir:
        _write_status(status_dir, worker.status())


def _run(model: torch.nn.Module, worker: WorkerLocal, command: dict) -> None:
    name = command["command"]
    if name == "init":
        worker.start(TeleportInitInfo(**command["init_info"]))
        _workers[id(model)] = (worker, command.get("status_dir"))
    elif name == "update":
        worker.commit(TeleportUpdateInfo(command["version"], command.get("wait_s")))
    elif name == "hold" and worker.rank in command["ranks"]:
        worker.hold(bool(command["on"]))


def _write_status(status_dir: str, status: dict) -> None:
    os.makedirs(status_dir, exist_ok=True)
    path = os.path.join(status_dir, f"rank{status['rank']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(status, f)
    os.replace(path + ".tmp", path)


class SglangEngine:
    """A running SGLang server started with `--custom-weight-loader LOADER` (untested)."""

    def __init__(self, url: str, *, tp_size: int = 1, status_dir: str | None = None,
                 timeout: float = 600.0) -> None:
        self.url, self.tp_size, self.status_dir, self.timeout = url.rstrip("/"), tp_size, status_dir, timeout

    def init(self, init_info: dict) -> None:
        """Every worker follows `init_info["store_url"]` (fields: `TeleportInitInfo`)."""
        TeleportInitInfo(**init_info)  # a typo fails here, not in the workers
        self._send(control("init", init_info=init_info, status_dir=self.status_dir))

    def update(self, version: int, wait_s: float | None = None) -> str | None:
        """The pause: commit `version` on every worker or none. Returns the group's outcome
        ("APPLIED", "SKIPPED", "RESYNC") where a `status_dir` is readable, else None."""
        self._send(control("update", version=version, wait_s=wait_s), flush_cache=True)
        outcomes = {tuple(o) for s in self.status() for o in s["outcomes"][-1:] if o[0] == version}
        return outcomes.pop()[1] if len(outcomes) == 1 else None

    def hold(self, ranks: list[int], on: bool) -> None:
        """Stop (on) or restart (off) staging on the workers of TP ranks `ranks`."""
        self._send(control("hold", ranks=ranks, on=on))

    def status(self) -> list[dict]:
        """Every rank's status as it last wrote it (empty without a readable `status_dir`)."""
        if not self.status_dir:
            return []
        found = []
        for rank in range(self.tp_size):
            try:
                with open(os.path.join(self.status_dir, f"rank{rank}.json")) as f:
                    found.append(json.load(f))
            except (OSError, ValueError):
                return []
        return found

    def request(self, named: list, flush_cache: bool = False) -> bytes:
        """The JSON body of `/update_weights_from_tensor` for a control message."""
        body = {"serialized_named_tensors": [serialize(named)] * self.tp_size, "load_format": LOADER,
                "flush_cache": flush_cache}
        return json.dumps(body).encode()

    def _send(self, named: list, flush_cache: bool = False) -> None:
        request = urllib.request.Request(self.url + "/update_weights_from_tensor", data=self.request(named, flush_cache),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                reply = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as e:
            raise SglangUpdateError(f"/update_weights_from_tensor failed ({e.code}): {e.read()[:2000]!r}") from e
        if not reply.get("success", True):
            raise SglangUpdateError(f"/update_weights_from_tensor failed: {reply.get('message')}")
