"""Sparse chunks from the GPU's symbol streams: stream coding (nvCOMP on the GPU, or the
CPU's zstd) and the chunk tables of docs/FORMAT.md, for all tensors of a pack at once."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from weight_teleport.codec import streams as codecs
from weight_teleport.codec.cuda import entropy, symbols
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.format import Group, Stream, write_groups

MIN_CODED = 16
"""Streams shorter than this are stored raw (as the CPU backend does)."""
CODEC_ID = {"zstd": codecs.ZSTD, "lz4": codecs.LZ4, "ans": codecs.NVCOMP_ANS}


def _pinned_host(t: torch.Tensor) -> np.ndarray:
    host = torch.empty(t.numel(), dtype=torch.uint8, pin_memory=True)
    host.copy_(t)
    return host.numpy()


def _code_nvcomp(cfg: CudaCodecConfig, st: symbols.SymbolStreams, todo: np.ndarray, raw_host: np.ndarray):
    """Per stream of `todo` (flat indices): (codec id, stored bytes), with nvCOMP."""
    off, ln = st.offsets.ravel()[todo], st.lengths.ravel()[todo]
    out, out_off, pending = entropy.compress(cfg, st.buffer, off, ln)
    sizes, statuses = (t.cpu().numpy() for t in pending.host())
    sizes, statuses = pending.unpermute(sizes), pending.unpermute(statuses)
    if (statuses != 0).any():
        raise RuntimeError(f"nvCOMP {cfg.algorithm} failed on {int((statuses != 0).sum())} streams")
    comp = _pinned_host(out)
    cid = CODEC_ID[cfg.algorithm]
    return [(cid, comp[o:o + s].tobytes()) if s < n else (codecs.RAW, raw_host[a:a + n].tobytes())
            for o, s, a, n in zip(out_off, sizes, off, ln)]


def _code_cpu(level: int, st: symbols.SymbolStreams, todo: np.ndarray, raw_host: np.ndarray, threads):
    off, ln = st.offsets.ravel()[todo], st.lengths.ravel()[todo]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(lambda a: codecs.encode_stream(raw_host[a[0]:a[0] + a[1]], level), zip(off, ln)))


def coded_streams(st: symbols.SymbolStreams, cfg: CudaCodecConfig, level: int, threads) -> list:
    """(codec id, stored bytes) of every stream, in the order of `st.lengths.ravel()`."""
    raw_host = _pinned_host(st.buffer)
    lengths = st.lengths.ravel()
    todo = np.flatnonzero(lengths >= MIN_CODED)
    if not cfg.portable and not entropy.available():
        raise RuntimeError(f"stream codec {cfg.algorithm!r} needs nvCOMP: pip install 'weight-teleport[cuda]'")
    if cfg.use_nvcomp and entropy.available() and todo.size:
        coded = _code_nvcomp(cfg, st, todo, raw_host)
    else:
        coded = _code_cpu(level, st, todo, raw_host, threads) if todo.size else []
    offsets = st.offsets.ravel()
    out = [(codecs.RAW, raw_host[o:o + n].tobytes()) for o, n in zip(offsets, lengths)]
    for i, c in zip(todo, coded):
        out[i] = c
    return out


def chunks_of(coded: list, first: int, ev: np.ndarray, chg: np.ndarray, n_classes: int,
              lengths: np.ndarray) -> list[bytes]:
    """The chunk bytes of one tensor whose segments start at `first` ([chunks, NCP] rows)."""
    out = []
    ncp = ev.shape[1]
    for k in range(ev.shape[0]):
        groups = []
        for c in range(n_classes):
            s = first + k * ncp + c
            if ev[k, c] == 0 and chg[k, c] == 0:
                groups.append(Group(0, []))
                continue
            groups.append(Group(int(ev[k, c]), [Stream(coded[4 * s + j][0], int(lengths[s, j]),
                                                       coded[4 * s + j][1]) for j in range(4)]))
        out.append(write_groups(groups))
    return out
