"""The subscriber's staging step: decode one checked object against the weights it
applies to, without touching the target.

Two modes: with a checkpoint view (the target's own tensors, in CPU memory or on one CUDA
device) one version at a time is staged against the live weights where they are; without
one, a shadow copy is advanced in the background and any number of staged versions queue
up for `apply`. A CUDA view is staged on a stream of its own, beside the sampler's work."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch

from weight_teleport.codec import StagedParts, StagedPatch, apply_staged, encode_delta, stage_delta
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec import walks as W
from weight_teleport.codec.dtypes import BY_NAME, dtype_info
from weight_teleport.codec.plan import DEFAULT_CHUNK_ELEMS
from weight_teleport.format import PackHeader
from weight_teleport.format.manifest import Entry
from weight_teleport.pipeline import assemble
from weight_teleport.pipeline.assemble import FlatParts
from weight_teleport.pipeline.fetch import Fetched
from weight_teleport.pipeline.verify import mismatched, record_digests, record_key


def _empty_like(header: PackHeader) -> dict[str, torch.Tensor]:
    return {t.name: torch.empty(t.shape, dtype=BY_NAME[t.dtype].torch_dtype) for t in header.tensors}


def _cuda_device(view: Mapping[str, torch.Tensor] | None) -> torch.device | None:
    if not view:
        return None
    first = next(iter(view.values()))
    return first.device if first.is_cuda else None


class Stager:
    """Where staged patches are decoded: the target's view, or a shadow copy."""

    def __init__(
        self,
        view: Mapping[str, torch.Tensor] | None,
        threads: int | None,
        device_budget: int | None = None,
        decompress_backend: str = "default",
    ):
        self.view = view
        self.shadow: dict[str, torch.Tensor] | None = None
        self.threads = threads
        self.device_budget = device_budget
        self.cuda = CudaCodecConfig(decompress_backend=decompress_backend)
        """The CUDA decoder's configuration, for CUDA targets (ValueError here for an unknown backend)."""
        self.device = _cuda_device(view)
        """The CUDA device of the view, or None."""
        self.stream = torch.cuda.Stream(self.device) if self.device is not None else None
        """The stream a CUDA view is staged and verified on: the sampler's streams go on."""

    @property
    def uses_view(self) -> bool:
        return self.view is not None

    @property
    def on_cuda(self) -> bool:
        """Whether packs are staged onto CUDA weights (then they are fetched into pinned
        memory, which the stage copies to the device from where it is)."""
        return self.device is not None

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def stage(self, entry: Entry, pack: Fetched | list[Fetched], head: int | None) -> StagedPatch | StagedParts:
        """Decode and verify `pack` (a list of packs for an entry made of parts) against the
        weights at version `head` (raises the codec's typed errors when they are not the
        pack's base). In shadow mode the shadow moves to the pack's version."""
        if entry.parts:
            assert isinstance(pack, list)  # an entry made of parts comes as its parts' packs
            return self._stage_parts(entry, pack, head)
        assert not isinstance(pack, list)
        base = self.view if self.uses_view else self.shadow
        options = dict(self._options(), header=pack.header)
        with self._on_stream():
            if entry.kind == "delta":
                assert base is not None, "plans from no weights start with a snapshot"
                staged = stage_delta(base, pack.data, base_version=head, **options)
            elif self.view is not None:
                staged = stage_delta(self.view, pack.data, **options)
            else:
                fresh = _empty_like(pack.header)
                staged = stage_delta(fresh, pack.data, **options)
                self.shadow = fresh
        if self.view is None:
            assert self.shadow is not None  # a snapshot made it, or it was the base
            apply_staged(self.shadow, staged, self.threads)
            return W.flat_walks(staged)
        return staged

    def _options(self) -> dict:
        return dict(
            strict=False,
            threads=self.threads,
            device_budget=self.device_budget,
            cuda=self.cuda if self.on_cuda else None,
        )

    def _stage_parts(self, entry: Entry, packs: list[Fetched], head: int | None) -> StagedParts | FlatParts:
        """Every part staged before any is applied. In shadow mode the shadow (a new one for
        a snapshot) takes every part, and the target gets one flat patch of whole tensors."""
        shadow = self.shadow
        if entry.kind == "snapshot" and not self.uses_view:
            shadow = assemble.empty_state([p.header for p in packs])
        base = self.view if self.uses_view else shadow
        assert base is not None, "plans from no weights start with a snapshot"
        with self._on_stream():
            staged = assemble.stage_parts(
                base, packs, base_version=head if entry.kind == "delta" else None, **self._options()
            )
        if self.uses_view:
            return staged
        assert shadow is not None  # without a view, the base is the shadow
        apply_staged(shadow, staged, self.threads)
        self.shadow = shadow
        return assemble.flat_patch(staged, shadow)

    def verify(self, staged: StagedPatch | StagedParts) -> list[str]:
        """Names of the view's tensors that lack the digests `staged` promised, once it was
        applied (read where the view lives, beside the sampler's work)."""
        assert self.view is not None  # staged patches are verified on the view only
        with self._on_stream():
            return mismatched(self.view, staged)

    def warm_up(self) -> None:
        """Stage and apply a small delta of every element type of a CUDA view on scratch
        tensors of its device, so that no kernel is compiled or loaded in the first pause
        (nor the first stage). A no-op for other views."""
        if self.device is None:
            return
        # a device comes from the view, and a stream with it
        assert self.view is not None and self.stream is not None
        dtypes = {t.dtype for t in self.view.values()}
        with self._on_stream():
            for dtype in sorted(dtypes, key=str):
                old, new = warm_pair(dtype)
                pack = encode_delta({"w": old}, {"w": new}, base_version=0, version=1, threads=self.threads)
                live = {"w": old.to(self.device)}
                staged = stage_delta(live, pack, base_version=0, threads=self.threads, cuda=self.cuda)
                apply_staged(live, staged)
                assert torch.equal(live["w"].cpu().view(torch.uint8), new.view(torch.uint8))
            self.stream.synchronize()

    def base_digests(self, headers) -> dict:
        """Digests of the weights the next pack is staged against (the view, or the shadow),
        by record key (`verify.record_key`), for each record of the pack `headers` (one
        header, or a list: a version made of parts) whose tensor they hold with its shape
        and dtype: what the records' `base_digest`s are compared with when staging fails."""
        base = self.view if self.uses_view else self.shadow
        if base is None:
            return {}
        headers = headers if isinstance(headers, list) else [headers]
        recs = [
            r
            for h in headers
            for r in h.tensors
            if r.name in base
            and tuple(base[r.name].shape) == r.shape
            and r.dtype in BY_NAME
            and base[r.name].dtype == BY_NAME[r.dtype].torch_dtype
        ]
        keys = [record_key(r.name, r.shape, r.box, r.order) for r in recs]
        with self._on_stream():
            found = record_digests(base, keys)
        return dict(zip(keys, found))


def warm_pair(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(old, new) CPU tensors of `dtype` over more than two chunks, a few percent of the
    elements changed by one unit in the last place and a few by more: the stage's sparse
    paths with every class kind."""
    g = torch.Generator().manual_seed(0)
    n = 2 * DEFAULT_CHUNK_ELEMS + 4099
    info = dtype_info(dtype)
    if info.is_float:
        old = (torch.randn(n, generator=g) * 0.02).to(dtype)
    else:
        old = torch.randint(0, 2, (n,), generator=g).to(dtype)
    bits = old.view(info.int_torch).clone()
    bits[torch.rand(n, generator=g) < 0.03] ^= 1
    if info.nbytes > 1:
        bits[torch.rand(n, generator=g) < 0.002] ^= 0x25
    return old, bits.view(dtype)
