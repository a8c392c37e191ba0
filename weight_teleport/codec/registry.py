"""The codec registry's lookups: each backend, and each codec's encoder and stager per
backend, imported on first use from the table in format/codecs.py (the one place that
names them), so that no backend imports another and `backend.py` imports neither; and
the codec a caller picks for a delta's sparse records."""

import importlib
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

from weight_teleport.format.codecs import CHOICES, CODECS, DEFAULT, DEPRECATED_CODERS, Codec

BACKENDS = {"cpu": ".cpu.backend", "cuda": ".cuda.backend"}
"""Each backend's module (codec/backend.py's interface), relative to this package."""


def backend(name: str) -> ModuleType:
    """The backend `name` ("cpu" or "cuda"), imported on first use."""
    return importlib.import_module(BACKENDS[name], __package__)


def codec(name: str) -> Codec:
    """The registry's line of codec `name` (a name a pack's header was checked to hold)."""
    return CODECS[name]


def family(name: str) -> tuple[str, ...]:
    """The codecs of family `name` ("same", "sparse", "dense"), in the registry's order."""
    return tuple(n for n, c in CODECS.items() if c.family == name)


SAME = family("same")[0]
"""The codec of an unchanged tensor's record (no chunks)."""
SNAPSHOT = tuple(n for n, c in CODECS.items() if c.snapshot)
"""The codecs of a snapshot's records."""


def grouped(recs: list) -> dict[str, list]:
    """Records (`format.TensorRecord`s) by codec, in the registry's order, each codec's in
    their order."""
    out: dict[str, list] = {}
    for r in recs:
        out.setdefault(r.codec, []).append(r)
    return {name: out[name] for name in CODECS if name in out}


def _load(ref: str) -> Any:
    """The object "module:name" names (the module relative to this package)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module, __package__), name)


def cpu_coder(name: str) -> tuple[Callable, Callable]:
    """The CPU backend's (encoder, decoder) of one chunk of codec `name` (format/codecs.py
    gives their signatures)."""
    refs = CODECS[name].cpu
    assert refs is not None, f"codec {name!r} has no CPU coder"  # every codec but `same` has one
    return _load(refs[0]), _load(refs[1])


def cuda_encoder(name: str) -> Callable | None:
    """The CUDA backend's encoder of a batch's events into chunks of codec `name`; None:
    the CPU backend's codes them."""
    refs = CODECS[name].cuda
    return None if refs is None else _load(refs[0])


def cuda_stager(name: str) -> type | None:
    """The CUDA backend's stager of records of codec `name`; None: the CPU backend's
    stages them."""
    refs = CODECS[name].cuda
    return None if refs is None else _load(refs[1])


def choose(codec: str, coder: str | None = None, stacklevel: int = 2) -> str:
    """The codec a caller picked for a delta's sparse records: `codec`, or where `coder` is
    given, the codec its deprecated spelling meant (with a DeprecationWarning naming the
    codec, at `stacklevel` as the caller counts it). ValueError for anything else, naming
    the choices."""
    if coder is not None:
        if coder not in DEPRECATED_CODERS:
            raise ValueError(
                f"unknown coder {coder!r}: coder is deprecated; choose codec, one of {', '.join(map(repr, CHOICES))}"
            )
        if codec not in (DEFAULT, DEPRECATED_CODERS[coder]):
            raise ValueError(f"give codec={codec!r} alone, not with the deprecated coder={coder!r}")
        codec = DEPRECATED_CODERS[coder]
        warnings.warn(
            f"coder={coder!r} is deprecated: use codec={codec!r}", DeprecationWarning, stacklevel=stacklevel + 1
        )
    if codec not in CHOICES:
        old = f" ({codec!r} was a coder: codec={DEPRECATED_CODERS[codec]!r})" if codec in DEPRECATED_CODERS else ""
        raise ValueError(
            f"unknown codec {codec!r} for a delta's sparse records: choose one of {', '.join(map(repr, CHOICES))}{old}"
        )
    return codec
