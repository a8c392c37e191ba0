"""An SGLang server as a target, through SGLang's documented weight-update endpoints.

UNTESTED: SGLang does not run on the CPU machines this project is built and tested on
(sglang 0.5.23 needs a CUDA build of torch 2.14.1, flashinfer and sglang-kernel). This
adapter is written against SGLang 0.5.23's HTTP API and has never run against a server.

Start the server with the patch loader registered as a custom weight loader:

    python -m sglang.launch_server --model-path MODEL --tp-size N \\
        --custom-weight-loader weight_teleport.targets.sglang.load_patch

then `SglangTarget("http://127.0.0.1:30000", tp_size=N)`, on the server's host:

- `apply` posts the staged patch to `/update_weights_from_tensor` with
  `load_format=LOADER`: per tensor, its flat checkpoint indices (int64), the new bit
  patterns and the checkpoint shape, as named tensors serialized by SGLang's
  `MultiprocessingSerializer`, one payload per TP rank. In each rank, `load_patch` maps
  names and indices onto that rank's parameters (probing SGLang's own `load_weights`, as
  the vLLM target does) and writes only its slice, in place.
- `load` posts full checkpoint tensors to the same endpoint with SGLang's own loader.
- `load_from_disk` posts a checkpoint directory to `/update_weights_from_disk`.

`/update_weights_from_distributed` (an NCCL broadcast from a trainer's process group) does
not fit a subscriber that holds bytes, so it is not used. Tensors travel as handles to
shared memory (CUDA IPC for GPU tensors), not as bytes: the target must run on the server's
host, and its tensors live on `device`."""

import json
import urllib.error
import urllib.request
from collections.abc import Mapping

import numpy as np
import torch

from weight_teleport.codec import StagedPatch
from weight_teleport.errors import WeightTeleportError
from weight_teleport.targets.base import Target
from weight_teleport.targets.vllm import probe, write_box

LOADER = "weight_teleport.targets.sglang.load_patch"
"""Pass to `sglang.launch_server --custom-weight-loader`."""


class SglangUpdateError(WeightTeleportError, RuntimeError):
    """The SGLang server refused or failed a weight update; its message says why."""


class SglangTarget(Target):
    """A running SGLang server started with `--custom-weight-loader LOADER` (untested)."""

    def __init__(self, url: str, *, tp_size: int = 1, device: str = "cuda",
                 timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.tp_size = tp_size
        self.device = device
        self.timeout = timeout

    def load(self, state: Mapping[str, torch.Tensor]) -> None:
        self._post_tensors([(n, t.to(self.device)) for n, t in state.items()], load_format=None)

    def apply(self, staged: StagedPatch) -> None:
        self._post_tensors(_patch_tensors(staged, self.device), load_format=LOADER)

    def load_from_disk(self, path: str) -> None:
        """Reload every weight from a checkpoint directory on the server's filesystem."""
        self._post("/update_weights_from_disk", {"model_path": path})

    def _post_tensors(self, named: list, load_format: str | None) -> None:
        try:
            from sglang.srt.utils import MultiprocessingSerializer
        except ImportError as e:
            raise ImportError("the SGLang target needs sglang on the server's host: "
                              "pip install sglang") from e
        payload = MultiprocessingSerializer.serialize(named, output_str=True)
        self._post("/update_weights_from_tensor",
                   {"serialized_named_tensors": [payload] * self.tp_size,
                    "load_format": load_format, "flush_cache": True})

    def _post(self, route: str, body: dict) -> None:
        request = urllib.request.Request(self.url + route, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                reply = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as e:
            raise SglangUpdateError(f"{route} failed ({e.code}): {e.read()[:2000]!r}") from e
        if not reply.get("success", True):
            raise SglangUpdateError(f"{route} failed: {reply.get('message')}")


def _patch_tensors(staged: StagedPatch, device: str) -> list[tuple[str, torch.Tensor]]:
    """The patch as named tensors: NAME|idx (int64 flat indices), NAME|bits, NAME|shape."""
    named = []
    for t in staged.tensors:
        if not t.chunks:
            continue
        idx = np.concatenate([np.arange(c.start, c.start + c.values.size, dtype=np.int64)
                              if c.positions is None else c.positions.astype(np.int64) + c.start
                              for c in t.chunks])
        bits = np.concatenate([c.values for c in t.chunks])
        signed = np.dtype(f"<i{t.info.nbytes}") if t.info.nbytes > 1 else np.dtype(np.uint8)
        named += [(f"{t.name}|idx", torch.from_numpy(idx).to(device)),
                  (f"{t.name}|bits", torch.from_numpy(bits.view(signed)).to(device)),
                  (f"{t.name}|shape", torch.tensor(t.shape, dtype=torch.int64))]
    return named


def load_patch(model: torch.nn.Module, named_tensors: list) -> None:
    """SGLang custom weight loader: write a patch (see `_patch_tensors`) into this rank's
    parameters, in place. Where each checkpoint tensor lives is probed once and cached."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in named_tensors:
        name, _, field = key.rpartition("|")
        parts.setdefault(name, {})[field] = tensor
    if not hasattr(model, "_teleport_boxes"):
        model._teleport_boxes = {}
    new = {n: tuple(p["shape"].tolist()) for n, p in parts.items() if n not in model._teleport_boxes}
    if new:
        model._teleport_boxes.update(probe(model, new))
    params = dict(model.named_parameters())
    for name, p in parts.items():
        box = model._teleport_boxes[name]
        if box is not None:
            write_box(params[box.param], box, p["idx"], p["bits"])
