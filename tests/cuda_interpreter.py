"""The CUDA backend's Triton kernels run by Triton's interpreter on CPU tensors, no GPU
needed: GPU-path packs are byte-identical to the CPU backend's, GPU-path stage + apply is
bit-exact (versions made of parts too: records over boxes, cut where a sampler's slice
ends), digests match the CPU's, and corrupt chunks behind valid CRCs are refused with the
state untouched.

Run by tests/codec/test_codec_cuda_interpreter.py in a subprocess (TRITON_INTERPRET=1 must be set
before triton is imported). Exits 1 and prints the failing cases on a mismatch."""

import dataclasses
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import folders  # noqa: E402,F401 (helpers of other test folders)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import zlib  # noqa: E402

from helpers import (chunk_table_failures, crc_ranges, decode_one_gap, decoded_one_gap, inverted_pair,  # noqa: E402
                     popcount_prefix, with_renewed_crcs)

import weight_teleport as wt  # noqa: E402
from weight_teleport.codec import Hint, TensorSlice  # noqa: E402
from weight_teleport.codec import api  # noqa: E402
from weight_teleport.codec import digest as D  # noqa: E402
from weight_teleport.codec.cpu import backend as cpu  # noqa: E402
from weight_teleport.codec.cuda import backend as gpu  # noqa: E402
from weight_teleport.codec.cuda.encode import encoder  # noqa: E402
from weight_teleport.codec.cuda.kernels import crc, digest, walk_copy  # noqa: E402
from weight_teleport.codec.cuda.live import walk_2d  # noqa: E402
from weight_teleport.codec.cuda.runtime import memory  # noqa: E402
from weight_teleport.codec.cuda.config import CudaCodecConfig  # noqa: E402
from weight_teleport.errors import PackMismatchError, WeightTeleportError  # noqa: E402
from weight_teleport.format import read_header  # noqa: E402
from weight_teleport.format.codecs import CODECS  # noqa: E402

memory.on_device = lambda t: True  # the interpreter runs the kernels on CPU tensors
memory.pinned_empty = lambda n: np.empty(n, np.uint8)  # no pinned memory without CUDA
PORTABLE = CudaCodecConfig(stream_coder="cpu-zstd")


def pair(dtype, n, density, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        old = (torch.randn(n, generator=g) * 0.02).to(dtype)
        changed = torch.rand(n, generator=g) < density
        new = torch.where(changed, (old.float() * (1 + 0.05 * torch.randn(n, generator=g))).to(dtype), old)
    else:
        old = torch.randint(-100, 100, (n,), generator=g).to(dtype)
        new = torch.where(torch.rand(n, generator=g) < density, old + 1, old)
    return old, new


def many_classes_pair(seed):
    """Elements of 17 exponents: 4 of those of exponent b < 16 change, among about
    4 * 2^((b + 1/2) / 2) (the middle of the class plan's half-octave band b), none of the
    last exponent's: with 4 events needed a class (set in main), the plan reaches its limit
    of 16 classes in one chunk (3,144 elements)."""
    g = torch.Generator().manual_seed(seed)
    counts = [int(4 * 2 ** ((b + 0.5) / 2)) + 1 for b in range(16)] + [200]
    e = torch.cat([torch.full((c,), b) for b, c in enumerate(counts)])
    moved = torch.cat([torch.arange(c) < (4 if b < 16 else 0) for b, c in enumerate(counts)])
    order = torch.randperm(e.numel(), generator=g)
    e, moved = e[order], moved[order]
    old = (torch.ldexp(1 + torch.rand(e.numel(), generator=g), -e - 3)).bfloat16()
    return old, torch.where(moved, (old.float() * 1.01).bfloat16(), old)


def on(backend, fn):
    api._backend = lambda tensors: backend
    return fn()


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def same_state(a, b) -> bool:
    return all(bits(a[k]) == bits(b[k]) for k in b)


CASES = [(torch.bfloat16, (9000,), 0.02), (torch.bfloat16, (3000, 1100), 0.8), (torch.float32, (3000,), 0.05),
         (torch.float16, (3000,), 0.1), (torch.float64, (2000,), 0.05), (torch.float8_e4m3fn, (3000,), 0.05),
         (torch.int32, (3000,), 0.05), (torch.bfloat16, (3000,), None), (torch.bfloat16, (), "classes")]
"""(dtype, element counts of its tensors, density or None: an inverted class, "classes": 16
classes). The interpreter's time goes with the chunks a GPU-path call handles (each at
least a program of every kernel, the CRC's a byte a step), so the tensors are of one
chunk, but for one of three chunks (first, middle and last), and the float32 state's
several tensors of a type in one batch, its types interleaved."""
PARTS = {"states-a": (0, 3, 5, 7), "states-b": (1, 2, 4, 6, 8)}
"""The states each part checks (indices into CASES), parts of about equal time."""


def states(which=range(len(CASES))):
    for i, (dtype, sizes, density) in ((i, CASES[i]) for i in which):
        old, new = {}, {}
        for j, n in enumerate(sizes):
            o, m = inverted_pair(n, j) if density is None else pair(dtype, n, density, 10 * i + j)
            old[f"t{j}"], new[f"t{j}"] = o, m
        if density == "classes":
            old["t0"], new["t0"] = many_classes_pair(0)
        if dtype == torch.float32:  # a second element type (two batches), and a view off 8-byte alignment
            old["h"], new["h"] = pair(torch.bfloat16, 2000, 0.03, 99)
            old["v"], new["v"] = (x[1:] for x in pair(torch.bfloat16, 2001, 0.03, 98))
            old["w"], new["w"] = pair(torch.float32, 1500, 0.05, 97)  # the first type again: batches interleave
            old["d"], new["d"] = pair(torch.float32, 1000, 0.8, 95)  # dense (CPU-coded) beside sparse batches
            old["z"], new["z"] = pair(torch.bfloat16, 1000, 0.0, 94)  # unchanged
        # element types of one width with other bit layouts: each is a batch of its own
        for other in {torch.float16: [torch.bfloat16, torch.int16], torch.int32: [torch.float32],
                      torch.float8_e4m3fn: [torch.float8_e5m2, torch.int8]}.get(dtype, []):
            old[str(other)], new[str(other)] = pair(other, 1500, 0.08, 96)
        yield f"{dtype} n={sizes} density={density}", old, new


def corrupt(pack: bytes, index: int, at: int, value: int) -> bytes:
    """`pack` with byte `at` of its chunk `index` set to `value`, the chunk's CRC renewed."""
    def mutate(i: int, data: bytearray) -> None:
        if i == index:
            data[at % len(data)] = value
    return with_renewed_crcs(pack, mutate)


def per_tensor_sums() -> list[str]:
    """ChunkTable.per_tensor (runs of rows, one atomic add per column where a run lies in one
    tensor) against numpy's sums mod 2^64: int32 and int64 rows, values that wrap, tensors
    without chunks, runs across tensor boundaries."""
    from weight_teleport.codec.cuda.kernels import chunk_table
    out, rng = [], np.random.default_rng(7)
    sizes = [0, 1, 5000, 0, 37, 10000, 3, 0]
    flats = [torch.empty(n, dtype=torch.int16) for n in sizes]
    table = chunk_table.build(flats, 64, 16)
    for dtype, cols in ((np.int32, (1000,)), (np.int64, (2,)), (np.int64, ()), (np.int32, (70,))):
        info = np.iinfo(dtype)
        rows = rng.integers(info.min, info.max, size=(table.programs, *cols), dtype=dtype, endpoint=True)
        got = table.per_tensor(torch.from_numpy(rows)).numpy()
        want = np.zeros((len(sizes), *cols), np.uint64)
        np.add.at(want, table.program_tensor.numpy(), rows.astype(np.int64).view(np.uint64))
        if got.shape != want.shape or not np.array_equal(got.view(np.uint64), want):
            out.append(f"per_tensor of {dtype.__name__} rows {cols} differs from numpy's sums")
    print("per-tensor sums checked", flush=True)
    return out


def inflate_orchestration() -> list[str]:
    """The GPU stage's inflate (layout walk, gather of the stored bytes, one decompress call
    over the zstd streams, length checks) fills the same buffer as the CPU path, nvCOMP's
    batched call stood in by the CPU's zstd (nvCOMP has no CPU build; the GPU tests run the
    real one)."""
    import zstandard

    from weight_teleport.codec.cuda.kernels import stream_tables
    from weight_teleport.codec.cuda.runtime import nvcomp
    from weight_teleport.codec.cuda.stage import decode_streams
    old, new = pair(torch.float32, 6000, 0.3, 21)
    free_classes, CODECS["sparse"] = CODECS["sparse"], DEFAULT_SPARSE
    try:  # the default cost: with free classes the sparse codec can lose to a dense one
        pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=4096)
    finally:
        CODECS["sparse"] = free_classes
    header = read_header(pack)
    rec = header.tensors[0]
    assert rec.codec == "sparse", rec.codec
    starts = np.array([header.payload_offset + c.offset for c in rec.chunks], np.int64)
    lengths = np.array([c.length for c in rec.chunks], np.int64)
    k = np.full(starts.size, max(c for _, c in rec.classes) + 1, np.int64)
    st = stream_tables.read(np.frombuffer(pack, np.uint8), starts, lengths, k, 16)
    want = decode_streams.inflate(pack, st, "cpu")

    class Done:
        def __init__(self, sizes):
            self.order, self.sizes = np.arange(len(sizes)), sizes

        def host(self):
            return torch.tensor(self.sizes, dtype=torch.int64), torch.zeros(len(self.sizes), dtype=torch.int32)

    def plan_decompress(cfg, offsets, stored, dst_offsets, raw, stream, codec):
        table = np.stack([offsets, stored, raw, dst_offsets]).astype(np.int64)
        return nvcomp.DecompressPlan(np.arange(raw.size), [(0, raw.size, "zstd")], [0], table)

    def decompress(cfg, src, dst, plan):
        sizes = []
        for o, n, r, d in plan.table.T.tolist():
            out = zstandard.ZstdDecompressor().decompress(src[o:o + n].numpy().tobytes(), max_output_size=r)
            dst[d:d + len(out)] = torch.frombuffer(bytearray(out), dtype=torch.uint8)
            sizes.append(len(out))
        return Done(sizes)

    saved = nvcomp.available, nvcomp.plan_decompress, nvcomp.decompress
    nvcomp.available, nvcomp.plan_decompress, nvcomp.decompress = (lambda: True), plan_decompress, decompress
    try:
        got = decode_streams.inflate(pack, st, "cpu")
    finally:
        nvcomp.available, nvcomp.plan_decompress, nvcomp.decompress = saved
    n = want.buffer.numel() - decode_streams.PAD
    print(f"inflate orchestration: {int((st.codec == 1).sum())} zstd streams", flush=True)
    if not (st.codec == 1).any() or not np.array_equal(got.offsets, want.offsets) or \
            not torch.equal(got.buffer[:n], want.buffer[:n]) or bool(got.failed):
        return ["the GPU path's inflate fills another buffer than the CPU path's"]
    return []


def decoder_edges() -> list[str]:
    """The symbol decoder on one event of gap value 2^22 (the largest a chunk holds: decoded)
    and 2^22 + 1 (malformed), and the bitmap prefix against numpy's."""
    from weight_teleport.codec.cuda.kernels import stage_bitmap
    out = []
    for extra, malformed in ((0, False), (1, True)):
        dec, v = decode_one_gap(extra, "cpu")
        if bool(dec.malformed) != malformed or not (malformed or decoded_one_gap(dec, v)):
            out.append(f"the decoder on a gap value of 2^22 + {extra}")
    words = torch.from_numpy(np.random.default_rng(3).integers(-2 ** 31, 2 ** 31, 5000, dtype=np.int64).astype(np.int32))
    words[::5], words[1::7] = -1, 0
    if not np.array_equal(stage_bitmap.prefix(words).numpy(), popcount_prefix(words.numpy())):
        out.append("the bitmap prefix differs from numpy's")
    print("decoder edges checked", flush=True)
    return out


PINNED = "torch.bfloat16 n=(9000,)"
"""The state (one batch) whose pack is written around its payload in place (pinned=True)."""
TWO_WAVES = ("float32", "None", "classes")
"""The states (two types, inverted classes, 16 classes) scanned in two waves, their events
merged, written into pinned memory (several batches: copied there)."""


def encode_failures(name: str, old: dict, new: dict) -> list[str]:
    """The GPU path's pack of a state against the CPU's (one GPU-path encode a state, of the
    form the state is for: the interpreter's time goes with them), then its stage + apply."""
    def encode_on(backend, **kw):
        return bytes(on(backend, lambda: wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=4096,
                                                         **kw)))
    cpu_pack = encode_on(cpu)
    if name.startswith(PINNED):
        how, gpu_pack = "written around its payload (pinned=True)", encode_on(gpu, cuda=PORTABLE, pinned=True)
    elif any(k in name for k in TWO_WAVES):
        waves, encoder.WAVE_ELEMS = encoder.WAVE_ELEMS, 0
        try:
            how, gpu_pack = "scanned in two waves", encode_on(gpu, cuda=PORTABLE, pinned=True)
        finally:
            encoder.WAVE_ELEMS = waves
    else:
        how, gpu_pack = "", encode_on(gpu, cuda=PORTABLE)
    failures = [] if gpu_pack == cpu_pack else [f"{name}: GPU-path pack {how} differs from the CPU's"]
    if "classes" in name and max(c for t in read_header(cpu_pack).tensors for _, c in t.classes) != 15:
        failures.append(f"{name}: the plans do not reach 16 classes")
    state = {k: v.clone() for k, v in old.items()}
    on(gpu, lambda: wt.apply_staged(state, wt.stage_delta(state, cpu_pack)))
    if not same_state(state, new):
        failures.append(f"{name}: GPU-path stage + apply is not bit-exact")
    print(name, "ok" if not failures else "", flush=True)
    return failures


def digest_failures() -> list[str]:
    """GPU digests of tensors and views (off 8-byte alignment, strided) against the CPU's,
    of one word to several programs' words (16,384 words a program)."""
    failures = []
    for dtype in (torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float64):
        for n in (0, 1, 3, 1001, 70001):
            t = pair(dtype, n, 0.0, n)[0]
            for view in (t, t[1:], t[::2]):
                if gpu.digest(view) != cpu.digest(view):
                    failures.append(f"GPU digest of {dtype} n={n} differs from the CPU's")
    views = [v for n in (0, 1001, 70001) for t in [pair(torch.bfloat16, n, 0.0, n)[0]] for v in (t, t[4:], t[1:])]
    for t, s in zip(views, digest.word_sums(views).tolist()):
        if D.to_hex(D.finish(s & D.MASK64, t.numel() * t.element_size())) != cpu.digest(t):
            failures.append(f"GPU-path word sum of {t.numel()} elements differs from the CPU's digest")
    return failures


def walk_copy_failures() -> list[str]:
    """Runs of 2-D walk views (column blocks walked by columns or by rows, row blocks walked
    by columns: several tiles each way, edges partial) copied by tiles, against torch's
    copy of the same walk."""
    failures = []
    t = torch.arange(150 * 140, dtype=torch.int16).view(150, 140)
    for k, view in enumerate((t.t(), t[:, 20:90].t(), t[:, 20:90], t[10:140].t(), t.t()[7:100])):
        flat = view.contiguous().view(-1)
        for start, count in ((0, flat.numel()), (131, 4099), (flat.numel() - 65, 65), (64, 0)):
            out = walk_copy.copy_walk(view, torch.empty(count, dtype=torch.int16), start, walk_2d(view))
            if not torch.equal(out, flat[start:start + count]):
                failures.append(f"walk copy of view {k}, elements {start}..{start + count}, differs from torch's")
    return failures


def crc_failures() -> list[str]:
    data, offsets, lengths = crc_ranges(lengths=(0, 1, 32769))  # no program, one, two (the first piece partial)
    want = [zlib.crc32(data[o:o + n]) for o, n in zip(offsets, lengths)]
    got = crc.crc32(torch.from_numpy(data), offsets, lengths).numpy().view("uint32").tolist()
    failures = [] if got == want else ["GPU-path CRC-32 of byte ranges differs from zlib's"]
    on_device = crc.crc32(torch.from_numpy(data), torch.from_numpy(offsets), torch.from_numpy(lengths), lengths + 5000)
    if on_device.numpy().view("uint32").tolist() != want:
        failures.append("GPU-path CRC-32 of byte ranges given on the device (launch sized by bounds) differs from zlib's")
    return failures


def corruption_failures(tries: int = 6) -> list[str]:
    """Chunks of a 2-chunk pack corrupted behind renewed CRCs, staged on the GPU path: refused
    with the state untouched, or (a byte the decoder does not read) the new weights."""
    old, new = pair(torch.bfloat16, 5000, 0.05, 7)
    pack = on(cpu, lambda: wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=4096))
    return staged_corruptions(pack, old, new, [(k % 2, 37 * k + 11, (59 * k + 1) % 256) for k in range(tries)], "")


def staged_corruptions(pack: bytes, old, new, edits: list, label: str) -> list[str]:
    """`pack` (of tensor "w") with each (chunk, byte, value) of `edits` behind a renewed CRC,
    staged on the GPU path: refused with the state untouched, or (a byte the decoder does
    not read) the new weights; at least half of them refused."""
    failures, refused = [], 0
    for k, edit in enumerate(edits):
        bad = corrupt(pack, *edit)
        state = {"w": old.clone()}
        try:
            on(gpu, lambda: wt.apply_staged(state, wt.stage_delta(state, bad)))
        except WeightTeleportError:
            refused += 1
            if bits(state["w"]) != bits(old):
                failures.append(f"{label}corruption {k}: refused but the state changed")
            continue
        if bits(state["w"]) != bits(new):
            failures.append(f"{label}corruption {k}: accepted and the result is not the new weights")
    print(f"{label}corruptions refused: {refused} of {len(edits)}", flush=True)
    if refused < len(edits) // 2:
        failures.append(f"only {refused} of {len(edits)} {label}corrupt chunks refused")
    return failures


PART_SHAPES = {"rows": (40, 24), "cols": (24, 40), "tile": (30, 20), "norm": (50,)}
"""Tensors of a version made of two trainer ranks' parts: row shards cut by a sampler's
bound, column shards walked by columns, a rectangular tile each rank (rows and columns
split), a tensor on one rank alone."""


def part_boxes(rank: int) -> dict:
    """Rank `rank`'s box of each tensor it holds (uneven)."""
    boxes = {"rows": ((0, 16), (0, 24)) if rank == 0 else ((16, 24), (0, 24)),
             "cols": ((0, 24), (0, 16)) if rank == 0 else ((0, 24), (16, 24)),
             "tile": ((0, 12), (0, 8)) if rank == 0 else ((12, 18), (8, 12))}
    if rank == 0:
        boxes["norm"] = ((0, 50),)
    return boxes


def parts_failures() -> list[str]:
    """Versions made of parts staged on the GPU path against whole tensors (what a CUDA
    TorchTarget's subscriber does: each record against the walk view of its box, chunks cut
    where the records' cuts say), snapshot and delta, then applied: bit-exact, each record's
    digest checked after; a part corrupted behind renewed CRCs is refused, nothing written.
    The tile's other corners stay at the base (each rank's box of it only)."""
    from weight_teleport.codec.walks import Hint, TensorSlice
    from weight_teleport.pipeline import assemble, verify
    from weight_teleport.pipeline.fetch import Fetched

    def stage(state, packs, kind):  # as the subscriber stages what fetch_parts returns
        checked = [Fetched(p, read_header(p)) for p in packs]
        return assemble.stage_parts(state, checked, base_version=0 if kind == "delta" else None)

    hints = {"rows": Hint("rows", (20 * 24,)), "cols": Hint("cols", (24 * 4, 24 * 30))}  # off the 64s
    g = torch.Generator().manual_seed(5)
    old = {k: (torch.randn(s, generator=g) * 0.02).bfloat16() for k, s in PART_SHAPES.items()}
    new = {}
    for k, t in old.items():
        u = t.view(torch.int16).clone()
        u[torch.rand(t.shape, generator=g) < 0.1] += 1
        new[k] = u.view(torch.bfloat16)

    def packs(kind):
        out = []
        for rank in (0, 1):
            boxes = part_boxes(rank)
            cut = lambda st: {k: st[k][tuple(slice(o, o + e) for o, e in b)].contiguous() for k, b in boxes.items()}
            slices = {k: TensorSlice(PART_SHAPES[k], b) for k, b in boxes.items()}
            opts = dict(version=1, chunk_elems=64, threads=1, slices=slices, hints={k: h for k, h in hints.items()})
            out.append(on(cpu, lambda: wt.encode_delta(cut(old), cut(new), base_version=0, **opts) if kind == "delta"
                          else wt.encode_snapshot(cut(new), **opts)))
        return out

    failures = []
    for kind in ("delta", "snapshot"):
        parts = packs(kind)
        if not any(t.cuts for p in parts for t in read_header(p).tensors):
            failures.append(f"{kind} parts: no record has cuts")
        state = {k: v.clone() for k, v in old.items()}
        staged = on(gpu, lambda: stage(state, parts, kind))
        on(gpu, lambda: assemble.apply_parts(state, staged))
        want = {k: v.clone() for k, v in old.items()}
        for rank in (0, 1):
            for k, b in part_boxes(rank).items():
                sl = tuple(slice(o, o + e) for o, e in b)
                want[k][sl] = new[k][sl]
        if not same_state(state, want):
            failures.append(f"{kind} parts: GPU-path stage + apply is not bit-exact")
        if on(gpu, lambda: verify.mismatched(state, staged)):
            failures.append(f"{kind} parts: the records' digests do not check after apply")
        refused = 0
        for k in range(4):  # a part's chunk corrupted behind renewed CRCs: refused, or (a byte no decoder reads) right
            bad = corrupt(parts[k % 2], k, 7 * k + 3, (91 * k + 17) % 256)
            state = {k: v.clone() for k, v in old.items()}
            try:
                staged = on(gpu, lambda: stage(state, [bad, parts[1]] if k % 2 == 0 else [parts[0], bad], kind))
            except WeightTeleportError:
                refused += 1
                if not same_state(state, old):
                    failures.append(f"{kind} parts: corruption {k} refused but the state changed")
                continue
            on(gpu, lambda: assemble.apply_parts(state, staged))
            if not same_state(state, want):
                failures.append(f"{kind} parts: corruption {k} accepted and the result is wrong")
        if refused < 2:
            failures.append(f"{kind} parts: only {refused} of 4 corrupt parts refused")
    print("parts staged on the GPU path", flush=True)
    return failures


def slice_failures() -> list[str]:
    """The two ranks of a TP=2 layout stage their slices on the GPU path (records staged in
    part: runs of chunks against narrowed live tensors, checked against their chunk
    digests): rows through contiguous views, columns of row-parallel layers through strided
    views written in place; a snapshot, sparse and dense deltas, each chained ahead of the
    pause (staged against a copy of the slices, written with `relocate`): bit-exact. A run
    of chunks corrupted behind renewed CRCs is refused with nothing written, or (a byte no
    decoder reads) gives the right weights."""
    from test_slice_stage import CONFIG, TP, _mutate, _state, engine_params
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import Publisher
    from weight_teleport.format.manifest import from_json
    from weight_teleport.store import open_store
    from weight_teleport.targets.slice_stage import apply_steps, stage_entry
    from weight_teleport.targets.vllm_layout import slice_hints, worker_slices

    gen = torch.Generator().manual_seed(3)
    states = [_state(gen)]
    for density in (0.02, 0.5, 0.01):
        states.append(_mutate(states[-1], density, gen))
    url = "memory://interpreter-slices"
    with Publisher(url, PublisherConfig(hints=slice_hints(CONFIG, [TP]), threads=1)) as pub:
        for v, st in enumerate(states, start=1):
            pub.publish(st, version=v).wait()
    store = open_store(url)
    entries = [e for e in from_json(store.get_manifest()).entries if e.version == 1 or e.kind == "delta"]
    failures = []
    for rank in range(TP):
        slices = worker_slices(CONFIG, TP, rank)
        params = engine_params(_state(torch.Generator().manual_seed(9)), rank)
        chain = []
        for e in entries:
            chain.append(on(gpu, lambda: stage_entry(store, e, params, slices, pending=chain)))
        if not all(type(p).__name__ == "DevicePatch" for step in chain for p in step.patches):
            failures.append(f"rank {rank}: a step was not staged on the GPU path")
        if not any(type(g).__name__ == "WalkGroup" for step in chain for p in step.patches for g in p.groups):
            failures.append(f"rank {rank}: no column-parallel shard was written by a walk scatter")
        on(gpu, lambda: apply_steps(params, chain))
        want = engine_params(states[-1], rank)
        failures += [f"rank {rank}: {n} is not the last version's" for n in want
                     if bits(params[n]) != bits(want[n])]
    delta = entries[1]
    data = store.get(delta.key)
    refused = 0
    for k in range(6):
        bad = corrupt(data, k, 5 * k + 1, (37 * k + 11) % 256)
        store.put(delta.key + f".bad{k}", bad)
        entry = dataclasses.replace(delta, key=delta.key + f".bad{k}")
        for rank in range(TP):
            params = engine_params(states[0], rank)
            before = {n: t.clone() for n, t in params.items()}
            try:
                step = on(gpu, lambda: stage_entry(store, entry, params, worker_slices(CONFIG, TP, rank)))
            except WeightTeleportError:
                refused += 1
                if any(bits(params[n]) != bits(before[n]) for n in params):
                    failures.append(f"corruption {k}: refused on rank {rank} but its weights changed")
                continue
            on(gpu, lambda: apply_steps(params, [step]))
            want = engine_params(states[1], rank)
            if any(bits(params[n]) != bits(want[n]) for n in want):
                failures.append(f"corruption {k}: accepted on rank {rank} and the result is wrong")
    if refused < 4:
        failures.append(f"only {refused} of 12 corrupt stages refused")
    print("slices staged on the GPU path", flush=True)
    return failures


DEFAULT_SPARSE = CODECS["sparse"]


def refusal_failures() -> list[str]:
    """Records over walks written on the GPU path (cut at a receiver's slice bounds, by rows
    and by columns, or regular chunks; a digest per chunk; deltas and snapshots, sparse and
    dense): byte-identical to the CPU's packs. Records with cuts staged on the GPU path,
    whole and in part (a slice's run of chunks, checked against its chunk digests):
    bit-exact; a record without chunk digests staged in part is refused, the state
    untouched."""
    old, new = pair(torch.bfloat16, 64 * 64, 0.05, 7)
    old, new = old.view(64, 64), new.view(64, 64)
    failures = []
    dense = pair(torch.float32, 48 * 40, 0.5, 8)
    olds, news = {"w": old, "d": dense[0].view(48, 40)}, {"w": new, "d": dense[1].view(48, 40)}
    for hints in ({"w": Hint("rows", (32 * 64,)), "d": Hint("cols", (10 * 48, 30 * 48))},
                  {"w": Hint("cols", ()), "d": Hint("rows", ())}):
        for kind in ("delta", "snapshot"):
            encode = lambda: (wt.encode_delta(olds, news, base_version=0, version=1, chunk_elems=512, hints=hints)
                              if kind == "delta" else wt.encode_snapshot(news, version=1, chunk_elems=512, hints=hints))
            want, got = on(cpu, encode), bytes(on(gpu, encode))
            if not all(t.chunk_digests for t in read_header(want).tensors):
                failures.append(f"{kind} {hints}: the CPU's records carry no chunk digests")
            failures += [] if got == want else [f"{kind} over walks {hints}: GPU-path pack differs from the CPU's"]
    cut = on(cpu, lambda: wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1,
                                          hints={"w": Hint("rows", (32 * 64,))}))
    whole = on(cpu, lambda: wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=1024))
    live = {"w": old.clone()}
    on(gpu, lambda: wt.apply_delta(live, cut))
    failures += [] if bits(live["w"]) == bits(new) else ["a record with cuts staged on the GPU path is not bit-exact"]
    bottom = TensorSlice((64, 64), ((32, 32), (0, 64)))
    live = {"w": old[32:].clone()}
    on(gpu, lambda: wt.apply_delta(live, cut, held={"w": bottom}))
    failures += [] if bits(live["w"]) == bits(new[32:]) else ["a slice of a record staged on the GPU path is wrong"]
    live = {"w": old[32:].clone()}
    try:
        on(gpu, lambda: wt.stage_delta(live, whole, held={"w": bottom}))
        failures.append("the CUDA backend staged part of a record without chunk digests")
    except PackMismatchError as e:
        failures += [] if "no chunk digests" in str(e) else [f"part of a record refused with {e}"]
    failures += [] if bits(live["w"]) == bits(old[32:]) else ["refusing part of a record changed the state"]
    return failures


ADAPTIVE_STATES = [(torch.bfloat16, 1500, 0.02, 512), (torch.float32, 400, 0.9, 256), (torch.float16, 300, 0.3, 4096),
                   (torch.int8, 300, 0.5, 128), (torch.float64, 200, 0.05, 64), (torch.bfloat16, 3000, 0.002, 1 << 22)]
"""(dtype, elements, density, chunk_elems) of the `sparse_ac` states: every element width,
inverted classes (density 0.9), several chunks and one."""


def adaptive_failures(tries: int = 6) -> list[str]:
    """`sparse_ac` packs on the GPU path: written byte-identical to the CPU's (once with
    chunks' first room too small for their streams: coded again), staged bit-exact, on states
    of every width, with a record and its reversal (two tensors of one batch); corrupt
    chunks behind renewed CRCs refused with the state untouched, or exact."""
    from weight_teleport.codec.cuda.encode import adaptive
    failures = []
    for i, (dtype, n, density, chunk) in enumerate(ADAPTIVE_STATES):
        old, new = pair(dtype, n, density, 1)
        olds, news = {"a": old, "b": old.flip(0)}, {"a": new, "b": new.flip(0)}
        pack = on(cpu, lambda: wt.encode_delta(olds, news, base_version=0, version=1, chunk_elems=chunk,
                                               codec="sparse_ac"))
        if {t.codec for t in read_header(pack).tensors} != {"sparse_ac"}:
            failures.append(f"{dtype} {density}: the pack has no sparse_ac records")
        room = adaptive.ROOM_BASE, adaptive.ROOM_EVENT, adaptive.ROOM_CHANGE
        if i == 0:
            adaptive.ROOM_BASE, adaptive.ROOM_EVENT, adaptive.ROOM_CHANGE = 1, 0, 0
        try:
            gpu_pack = bytes(on(gpu, lambda: wt.encode_delta(olds, news, base_version=0, version=1, chunk_elems=chunk,
                                                             codec="sparse_ac")))
        finally:
            adaptive.ROOM_BASE, adaptive.ROOM_EVENT, adaptive.ROOM_CHANGE = room
        failures += [] if gpu_pack == pack else [f"sparse_ac {dtype} {density}: GPU-path pack differs from the CPU's"]
        state = {k: v.clone() for k, v in olds.items()}
        on(gpu, lambda: wt.apply_staged(state, wt.stage_delta(state, pack)))
        failures += [] if same_state(state, news) else [f"sparse_ac {dtype} {density}: GPU stage is not bit-exact"]
    old, new = pair(torch.bfloat16, 1600, 0.02, 3)
    pack = on(cpu, lambda: wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=400,
                                           codec="sparse_ac"))
    failures += staged_corruptions(pack, old, new, [(k % 4, 7 * k + 3, (59 * k + 1) % 256) for k in range(tries)],
                                   "sparse_ac ")
    return failures


def main(part: str) -> int:
    """Runs one part of the checks (PARTS: the GPU path's packs and stages of states;
    "parts": versions made of parts staged against whole tensors; "slices": a TP worker's
    slices staged in part; "adaptive": `sparse_ac`
    packs staged; "kernels": digests, CRCs,
    chunk tables, corrupt chunks, sums, inflate, decoder edges), so that processes can share
    them."""
    CODECS["sparse"] = dataclasses.replace(DEFAULT_SPARSE, class_cost_bits=0.0)  # many classes from small tensors
    if part in PARTS:
        failures = [f for name, old, new in states(PARTS[part]) for f in encode_failures(name, old, new)]
    elif part == "parts":
        failures = parts_failures()
    elif part == "slices":
        failures = slice_failures()
    elif part == "adaptive":
        failures = adaptive_failures()
    else:
        failures = digest_failures() + walk_copy_failures() + crc_failures() + chunk_table_failures("cpu") + corruption_failures()
        failures += per_tensor_sums() + inflate_orchestration() + decoder_edges() + refusal_failures()
    for f in failures:
        print("FAIL", f)
    print(f"{part}: {len(failures)} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
