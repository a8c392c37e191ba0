"""The inverse symbol step on the GPU, batched over every (chunk, class) segment of a set of
tensors of one element width: event ranks and residuals from the four decoded streams of
docs/FORMAT.md ("Codec sparse"), as the CPU's `symbols_to_class` makes them.

Nothing synchronises: stream disagreements (a bucket past 44, an rc in an inverted class,
extra bits, residual symbols or escapes left over or missing) raise a device flag that the
caller reads with its one transfer. Every read index is clamped into the buffer, so a
malformed pack reads garbage, never out of bounds."""

from dataclasses import dataclass

import torch

from weight_teleport.codec.cuda.inflate import _excl
from weight_teleport.codec.cuda.symbols import ESCAPE, RC

MAX_BUCKET = 44


@dataclass
class Decoded:
    ranks: torch.Tensor
    """Class rank of every event (int64), segments in order."""
    event_segment: torch.Tensor
    """Segment of every event (int64)."""
    residuals: torch.Tensor
    """Residual of every changed element (int64, low `bits` bits), segments in order."""
    malformed: torch.Tensor
    """Device bool."""


def _segments(counts: torch.Tensor, total: int):
    """(segment of each item, exclusive prefix of the counts [S + 1], index in its segment)."""
    dev = counts.device
    seg = torch.repeat_interleave(torch.arange(counts.numel(), device=dev), counts, output_size=total)
    start = _excl(counts)
    return seg, start, torch.arange(total, device=dev) - start[seg]


def _local_excl(flag: torch.Tensor, seg: torch.Tensor, start: torch.Tensor):
    """(index of each item among the flagged items of its segment, flagged items per segment)."""
    at = _excl(flag.long())
    return at[:-1] - at[start[seg]], at[start[1:]] - at[start[:-1]]


def _bytes(buf: torch.Tensor, at: torch.Tensor, n: int) -> torch.Tensor:
    """Little-endian integers of n bytes at `at` (int64; clamped reads)."""
    top = buf.numel() - 1
    out = torch.zeros_like(at)
    for b in range(n):
        out |= buf[(at + b).clamp(0, top)].long() << (8 * b)
    return out


def _unzigzag(z: torch.Tensor, bits: int) -> torch.Tensor:
    wmask = -1 if bits == 64 else (1 << bits) - 1
    return torch.where((z & 1) != 0, (wmask - (z >> 1)) & wmask, (z >> 1) + 1)


def _events(buf, off, raw, ev_cnt, n_events: int, inverted):
    """(ranks, rc, segment of each event, event starts per segment, malformed) from streams 1, 2."""
    seg, start, local = _segments(ev_cnt, n_events)
    top = buf.numel() - 1
    sym = buf[(off[seg, 0] + local).clamp(0, top)].long()
    bucket, rc = sym // RC, sym % RC
    bad = (bucket > MAX_BUCKET).any() | (inverted[seg] & (rc != 0)).any()
    nb = (bucket + 1) >> 1
    ne = torch.where(bucket > 0, nb - 1, 0)
    bit_at = _excl(ne)
    seg_bits = bit_at[start[1:]] - bit_at[start[:-1]]
    bad = bad | ((seg_bits + 7) // 8 != raw[:, 1]).any()
    bit = bit_at[:-1] - bit_at[start[:-1]][seg]
    word = _bytes(buf, off[seg, 1] + (bit >> 3), 4)
    extra = (word >> (bit & 7)) & ((torch.ones_like(ne) << ne) - 1)
    v = torch.where(bucket > 0, ((2 + ((bucket + 1) & 1)) << ne) | extra, 1)
    vsum = _excl(v)
    return vsum[1:] - vsum[start[seg]] - 1, rc, seg, start, bad


def decode(buf: torch.Tensor, off: torch.Tensor, raw: torch.Tensor, ev_cnt: torch.Tensor, res_cnt: torch.Tensor,
           inverted: torch.Tensor, n_events: int, n_res: int, bits: int) -> Decoded:
    """Ranks and residuals of every segment. Per segment (device tensors): `off`/`raw` [S, 4]
    slot offsets and raw lengths of its streams in `buf`, its events, its changed elements
    (events, or residual symbols in an inverted class) and whether it is inverted."""
    ranks, rc, ev_seg, ev_start, bad = _events(buf, off, raw, ev_cnt, n_events, inverted)
    seg, start, local = _segments(res_cnt, n_res)
    inv = inverted[seg]
    ev_idx = (ev_start[:-1][seg] + local).clamp(0, max(n_events - 1, 0))
    rrc = torch.where(inv, RC - 1, rc[ev_idx] if n_events else torch.zeros_like(local))
    need = rrc == RC - 1
    k, n_sym = _local_excl(need, seg, start)
    top = buf.numel() - 1
    sym = buf[(off[seg, 2] + k).clamp(0, top)].long()
    esc = need & (sym == ESCAPE)
    e, n_esc = _local_excl(esc, seg, start)
    nbytes = bits // 8
    zz = torch.where(need, sym + torch.where(inv, 0, RC - 1), rrc)
    res = torch.where(esc, _bytes(buf, off[seg, 3] + e * nbytes, nbytes), _unzigzag(zz, bits))
    bad = bad | (n_sym != raw[:, 2]).any() | (n_esc * nbytes != raw[:, 3]).any()
    return Decoded(ranks, ev_seg, res, bad)
