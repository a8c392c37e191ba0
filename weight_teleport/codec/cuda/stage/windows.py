"""Records staged in part on the GPU (a receiver holding a slice: codec/api.py's `windows`):
each run of chunks inside the slice becomes a record of its own, checked against its chunk
digests added up, against the live tensor narrowed to the run."""

import dataclasses

import msgspec
import numpy as np

from weight_teleport.codec import digest as D
from weight_teleport.codec.cuda.live import Live
from weight_teleport.errors import PackMismatchError


def window_digest(digests: list[str], spans, nbytes: int) -> str:
    """The digest of a run of a record's chunks, from their chunk digests (each over its
    words numbered by their place in the walk: their word sums add up)."""
    total = sum((e - s) * nbytes for s, e in spans)
    return D.to_hex(
        D.finish(sum(D.word_sum(D.from_hex(d), (e - s) * nbytes) for d, (s, e) in zip(digests, spans)), total)
    )


def windowed(lives: dict[str, Live], header, windows: dict):
    """(lives, header, cut): the records of `header` the state holds (`lives`), those staged
    in part (`windows`: name -> (walk start of the live tensor, first chunk, stop chunk),
    as codec/api.py makes them) cut to records of their own over the run of those chunks,
    their digests the chunks' added up, each against its live tensor narrowed to the run's
    elements (its digest words numbered from the run's first element). `cut`: name ->
    (the record as the pack holds it, its window) of each record cut."""
    if not windows and all(rec.name in lives for rec in header.tensors):
        return lives, header, {}
    recs, rows, firsts, out, cut = [], [], [0], dict(lives), {}
    for k, rec in enumerate(header.tensors):
        lo, hi = int(header.chunk_first[k]), int(header.chunk_first[k + 1])
        if rec.name not in lives:
            continue
        if rec.name in windows:
            walk_start, i, j = windows[rec.name]
            if i == j:
                del out[rec.name]
                continue
            spans = rec.chunk_spans(header.chunk_elems)[i:j]
            if not rec.chunk_digests or (header.kind == "delta" and not rec.chunk_base_digests):
                raise PackMismatchError(
                    f"tensor {rec.name!r}: the pack has no chunk digests, so a slice of it "
                    "cannot be verified alone; stage the whole record"
                )
            nb, first, stop = lives[rec.name].info.nbytes, spans[0][0], spans[-1][1]
            base = None if header.kind != "delta" else window_digest(rec.chunk_base_digests[i:j], spans, nb)
            cut[rec.name] = (rec, (first, i, j))
            rec = msgspec.structs.replace(
                rec,
                shape=(stop - first,),
                box=None,
                order=None,
                chunks=rec.chunks[i:j],
                cuts=[e - s for s, e in spans] if rec.cuts else [],
                chunk_digests=[],
                chunk_base_digests=[],
                digest=window_digest(rec.chunk_digests[i:j], spans, nb),
                base_digest=base,
            )
            out[rec.name] = lives[rec.name].narrowed(first - walk_start, stop - first, first)
            lo, hi = lo + i, lo + j
        recs.append(rec)
        rows.append(header.chunk_rows[lo:hi])
        firsts.append(firsts[-1] + hi - lo)
    sub = dataclasses.replace(
        header,
        tensors=recs,
        chunk_first=np.array(firsts, np.int64),
        chunk_rows=np.concatenate(rows) if rows else header.chunk_rows[:0],
    )
    return out, sub, cut
