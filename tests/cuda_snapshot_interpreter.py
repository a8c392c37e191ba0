"""The CUDA backend's snapshot path (codec/cuda/snapshot.py) run by Triton's interpreter on
CPU tensors: its packs decode bit-exact on the CPU backend, stage + apply bit-exact through
the CUDA backend, and a corrupt plane behind a renewed CRC is refused by the digest with the
state untouched. Run by tests/codec/test_codec_cuda_snapshot.py in a subprocess (TRITON_INTERPRET=1
must be set before triton is imported); exits 1 on a failure."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import folders  # noqa: E402,F401 (helpers of other test folders)
import numpy as np  # noqa: E402
import torch  # noqa: E402

import weight_teleport as wt  # noqa: E402
from weight_teleport.codec import inspect  # noqa: E402
from helpers import with_renewed_crcs  # noqa: E402
from weight_teleport.codec import api  # noqa: E402
from weight_teleport.codec.cuda import backend as gpu  # noqa: E402
from weight_teleport.codec.cuda import snapshot  # noqa: E402
from weight_teleport.codec.cuda.runtime import memory  # noqa: E402
from weight_teleport.errors import DigestMismatchError  # noqa: E402

memory.on_device = lambda t: True  # the interpreter runs the kernels on CPU tensors
memory.pinned_empty = lambda n: np.empty(n, np.uint8)  # no pinned memory without CUDA


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def main() -> None:
    g = torch.Generator().manual_seed(0)
    state = {"bf16": (torch.randn(2100, generator=g) * 0.02).bfloat16(),  # three chunks, the last short
             "f32": torch.randn(7, 13, generator=g),
             "i8": torch.randint(-5, 5, (300,), generator=g).to(torch.int8),
             "empty": torch.zeros(0, dtype=torch.float16),
             "f64": torch.randn(1100, generator=g).double(),
             "nan": torch.tensor([float("nan"), -0.0, 0.0, float("-inf")]).bfloat16()}
    api._backend = lambda tensors: gpu
    pack = wt.encode_snapshot(state, version=3, chunk_elems=1024)
    assert {t["codec"] for t in inspect(pack)["tensors"]} == {"dense_values"}
    decoded = wt.decode_snapshot(pack)  # the CPU backend reads the device's raw planes
    assert all(bits(decoded[k]) == bits(state[k]) for k in state), "CPU decode of a GPU snapshot differs"
    api._backend = lambda tensors: gpu
    live = {k: torch.zeros_like(v) for k, v in state.items()}
    wt.apply_staged(live, wt.stage_delta(live, pack))
    assert all(bits(live[k]) == bits(state[k]) for k in state), "GPU stage + apply of a GPU snapshot differs"
    snapshot.WAVE_BYTES = 5000  # waves of one to a few chunks, cut inside tensors, both ways
    small = wt.encode_snapshot(state, version=3, chunk_elems=1024)
    assert small == pack, "the wave size changed the snapshot's bytes"
    live = {k: torch.zeros_like(v) for k, v in state.items()}
    wt.apply_staged(live, wt.stage_delta(live, pack))
    assert all(bits(live[k]) == bits(state[k]) for k in state), "a stage in small waves differs"
    snapshot.WAVE_BYTES = 1 << 30
    def flip(i: int, chunk: bytearray) -> None:
        if i == 1:  # the second chunk of the first tensor: a byte of its planes
            chunk[50] ^= 0x40
    bad = with_renewed_crcs(bytes(pack), flip)
    live = {k: torch.zeros_like(v) for k, v in state.items()}
    try:
        wt.stage_delta(live, bad)
        raise SystemExit("a corrupt plane behind a valid CRC was accepted")
    except DigestMismatchError:
        pass
    assert all(not live[k].view(torch.uint8).any() for k in live), "a refused pack wrote weights"
    print("snapshot path ok")


if __name__ == "__main__":
    main()
