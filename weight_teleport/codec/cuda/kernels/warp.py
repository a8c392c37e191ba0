"""The scan, class-count, events and placement kernels as CUDA C warp code (warp.cu beside
this), compiled with NVRTC for each element type at first use.

A warp (the scan: a CTA) takes a block of a chunk. The scan counts each element's key in
per-lane counters in shared memory, the class counts count classes in each lane's registers;
the events and the placement give each lane a run of consecutive elements whose classes it
keeps as bit planes, and work per class and per change, not per element (see warp.cu).
The Triton kernels (encode_scan.py, class_ranks.py, encode_events.py, stage_place.py) compute the same
outputs and run where these cannot: under Triton's CPU interpreter, or where NVRTC cannot be
loaded. Where both can run the warp kernels are used: they are the faster ones, and tests
hold the two to the same outputs."""

import functools
from pathlib import Path

import torch

from weight_teleport.codec.cuda.runtime import nvrtc
from weight_teleport.codec.cuda.runtime.params import I64, POINTER, KernelParams

SOURCE = Path(__file__).with_name("warp.cu")
"""The kernels' CUDA C source (tests/codec/test_codec_warp_compile.py compiles it without a GPU)."""
WARPS, UNROLL = 4, 4
"""Warps of a CTA (one block of the chunk table each, or one block per CTA in the scan) and
32-element slices loaded at once (at least the elements of an 8-byte word)."""
enabled = True
"""False runs the Triton kernels instead (for comparisons)."""
SCAN_COUNTERS = True
"""The scan counts keys in per-lane counters where a type has at most 256 keys (False:
with `__match_any_sync` and shared bins, as for wider key sets; for comparisons)."""
SCAN_UNROLL = 8
"""Words a lane loads at once in the scan with per-lane counters, the next round's loaded
while this round's are counted: that scan is bound by its loads' latency, and more words
in flight hide more of it (the scan with shared bins is at its fastest with UNROLL)."""


class EventParams(KernelParams):
    """class_events' parameters (warp.cu's struct EventParams, in its order)."""

    CUDA_NAME = "EventParams"
    _fields_ = [
        (name, POINTER)
        for name in (
            "old",
            "rows",
            "prog",
            "nw",
            "new_off",
            "lut",
            "inv_tab",
            "rbase",
            "ebase",
            "eoff",
            "roff",
            "ranks_out",
            "res_out",
        )
    ] + [("programs", I64)]


class PlaceParams(KernelParams):
    """place_lanes' parameters (warp.cu's struct PlaceParams, in its order)."""

    CUDA_NAME = "PlaceParams"
    _fields_ = [
        (name, POINTER)
        for name in (
            "old",
            "rows",
            "prog",
            "lut",
            "inv_tab",
            "counts",
            "base",
            "seg_word",
            "bitmap",
            "pref",
            "roff",
            "res",
            "starts",
            "old_sums",
            "pos",
            "val",
            "sums",
        )
    ] + [(name, I64) for name in ("n_words", "n_res", "programs")]


PARAMS = (EventParams, PlaceParams)
"""The structs of warp.cu mirrored here; their layout checks end every module's source."""


def source() -> str:
    """warp.cu with the static_asserts that its parameter structs match their host mirrors."""
    return SOURCE.read_text() + "".join(p.layout_checks() for p in PARAMS)


def available(tensor: torch.Tensor) -> bool:
    """Whether the warp kernels can run on `tensor`'s device: one that NVRTC compiles for,
    with __match_any_sync (compute capability 7.0 on)."""
    return enabled and nvrtc.compiles_for(tensor) and nvrtc.capability(tensor.device) >= 70


@functools.cache
def _module(defines: tuple) -> nvrtc.Module:
    return nvrtc.Module(source(), SOURCE.name, dict(defines))


def _unroll(info, unroll: int | None = None) -> int:
    """Slices of a round: `unroll` (UNROLL when None), at least the elements of one 8-byte
    word (8 for 8-bit elements), as UNROLL requires."""
    return max(UNROLL if unroll is None else unroll, 64 // info.bits)


def _defines(info, block: int, unroll: int | None = None, **extra) -> tuple:
    u = _unroll(info, unroll)
    assert block % (32 * u) == 0 and extra.get("NCP", 0) <= 32 and u & (u - 1) == 0
    mant = info.mantissa_bits if info.is_float else 0
    return tuple(
        sorted(
            dict(
                BITS=info.bits,
                IS_FLOAT=info.is_float,
                MANT=mant,
                KMASK=(1 << info.exponent_bits) - 1,
                BLOCK=block,
                WARPS=WARPS,
                UNROLL=u,
                **extra,
            ).items()
        )
    )


def launch(
    kernel: str,
    table,
    info,
    args: list | KernelParams,
    shared: int = 0,
    unroll: int | None = None,
    warps: int = WARPS,
    **defines,
) -> None:
    """Run `kernel` with a warp per program of the chunk table `table`, `warps` warps a CTA
    (elements of `info`'s type; `defines` such as NCP, the class slots), `unroll` slices a
    round (UNROLL when None) and `shared` bytes of dynamic shared memory a warp. `args`: the
    kernel's parameter struct (its `programs` the table's), or a list of the parameters that
    precede the program count."""
    module = _module(_defines(info, table.block, unroll, **defines))
    if isinstance(args, KernelParams):
        assert args.programs == table.programs, "the parameter struct is for another chunk table"
        params = [args]
    else:
        params = [*args, table.programs]
    module.launch(kernel, -(-table.programs // warps), warps * 32, params, table.base.device, shared * warps)


def scan(table, info, nb: int, args: list) -> None:
    """Run the scan kernel over every program of `table`, a CTA per program, with `nb`
    histogram bins; `args` precede the program count."""
    lanes = SCAN_COUNTERS and info.exponent_bits <= 8
    warps = 2 if lanes else WARPS  # the lanes' counters hold two warps' counts
    module = _module(
        _defines(info, table.block, SCAN_UNROLL if lanes else None, NB=nb, SCAN_LANES=lanes, SCAN_WARPS=warps)
    )
    module.launch("scan_words", table.programs, warps * 32, [*args, table.programs], table.base.device)


def hist_counts(hist: torch.Tensor, table, luts: torch.Tensor, inverted: torch.Tensor, info, ncp: int):
    """([programs, ncp] int32 elements, events) of each class per program of `table`, a
    chunk table with the scan's blocks, from the scan's histograms `hist` ([programs, NB]
    int32, key + n_keys * changed); `luts` / `inverted` are the tensors' class maps and
    inverted flags."""
    assert hist.dtype == torch.int32 and hist.is_contiguous() and hist.shape[0] == table.programs
    assert luts.dtype == torch.uint8 and inverted.dtype == torch.int8 and inverted.shape[1] == ncp
    counts = torch.empty((table.programs, ncp), dtype=torch.int32, device=hist.device)
    events = torch.empty_like(counts)
    if table.programs:
        launch(
            "hist_counts",
            table,
            info,
            [hist, table.program_tensor, luts, inverted, counts, events],
            NCP=ncp,
            NB=hist.shape[1],
        )
    return counts, events
