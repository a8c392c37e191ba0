"""The delta codecs peers use, re-implemented for a side-by-side benchmark.

Every baseline is a pair ``encode(old, new) -> bytes`` and ``decode(old, blob) -> new``
over states (``dict[str, Tensor]`` with the same names, shapes and dtypes on both sides),
bit-exact on every bit pattern. Tensors are coded one by one in ``old``'s order; the blob
is the per-tensor payloads, each behind an 8-byte length. All baselines run on one thread.

* ``raw_bf16``: the new tensors' bytes (a full weight push).
* ``index_value``: int32 flat indices of the changed elements, then their new values
  (the sparse patch of TRL and vLLM weight updates).
* ``xor_zstd1``: XOR of old and new bit patterns, zstd level 1 (Miles disk-delta).
* ``gaps_zstd``: uint16 gaps between changed positions (0xFFFF skips 65535 positions
  without a change, so longer gaps are a run of escapes and a remainder), then the new
  values, zstd level 3 (slime).
* ``zipnn_delta``: ZipNN's delta mode (XOR, byte grouping, Huffman/zstd) from PyPI
  ``zipnn``; raises ``BaselineUnavailable`` when it is missing or cannot code a dtype.
"""

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import zstandard

from weight_teleport.bench.entropy import bit_view

State = Mapping[str, torch.Tensor]
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_LENGTH = struct.Struct("<Q")
_ESCAPE = 0xFFFF


class BaselineUnavailable(RuntimeError):
    """A baseline cannot run here (missing package, unsupported dtype)."""


@dataclass(frozen=True)
class Baseline:
    """A peer codec: ``encode(old, new) -> bytes`` and ``decode(old, blob) -> new``."""

    name: str
    encode: Callable[[State, State], bytes]
    decode: Callable[[State, bytes], dict[str, torch.Tensor]]


def _bits(t: torch.Tensor) -> np.ndarray:
    return bit_view(t).numpy().view(_UNSIGNED[t.element_size()])


def _tensor(bits: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    signed = bit_view(like).dtype
    return torch.from_numpy(bits).view(signed).view(like.dtype).view(like.shape)


def _join(payloads: Iterable[bytes | np.ndarray]) -> bytes:
    """Concatenate bytes-like payloads, each behind its length, copying each once."""
    parts: list[bytes | np.ndarray] = []
    for payload in payloads:
        parts += [_LENGTH.pack(memoryview(payload).nbytes), payload]  # type: ignore[arg-type]  # an ndarray is a buffer; its stubs say so from 3.12 only
    return b"".join(parts)  # type: ignore[arg-type]  # as above


def _split(blob: bytes) -> list[memoryview]:
    view, parts, at = memoryview(blob), [], 0
    while at < len(view):
        (size,) = _LENGTH.unpack_from(view, at)
        parts.append(view[at + _LENGTH.size : at + _LENGTH.size + size])
        at += _LENGTH.size + size
    return parts


def _per_tensor(
    name: str,
    encode_one: Callable[[np.ndarray, np.ndarray], bytes | np.ndarray],
    decode_one: Callable[[np.ndarray, memoryview], np.ndarray],
) -> Baseline:
    """Build a baseline from functions that code one tensor's unsigned bit patterns."""

    def encode(old: State, new: State) -> bytes:
        return _join(encode_one(_bits(t), _bits(new[n])) for n, t in old.items())

    def decode(old: State, blob: bytes) -> dict[str, torch.Tensor]:
        parts = _split(blob)
        if len(parts) != len(old):
            raise ValueError(f"{name}: blob has {len(parts)} tensors, state has {len(old)}")
        return {n: _tensor(decode_one(_bits(t), p), t) for (n, t), p in zip(old.items(), parts)}

    return Baseline(name, encode, decode)


def _raw_decode(old: np.ndarray, payload: memoryview) -> np.ndarray:
    return np.frombuffer(payload, old.dtype).copy()


def _index_value_encode(old: np.ndarray, new: np.ndarray) -> bytes:
    index = np.flatnonzero(old != new).astype(np.int32)
    return index.tobytes() + new[index].tobytes()


def _index_value_decode(old: np.ndarray, payload: memoryview) -> np.ndarray:
    count = len(payload) // (4 + old.itemsize)
    index = np.frombuffer(payload, np.int32, count)
    out = old.copy()
    out[index] = np.frombuffer(payload, old.dtype, count, offset=4 * count)
    return out


def _xor_zstd1_encode(old: np.ndarray, new: np.ndarray) -> bytes:
    return zstandard.ZstdCompressor(level=1).compress(np.bitwise_xor(old, new).tobytes())


def _xor_zstd1_decode(old: np.ndarray, payload: memoryview) -> np.ndarray:
    xor = zstandard.ZstdDecompressor().decompress(payload, max_output_size=old.nbytes)
    return np.bitwise_xor(old, np.frombuffer(xor, old.dtype))


def _gap_tokens(index: np.ndarray) -> np.ndarray:
    """uint16 tokens for sorted positions: gap = position - previous - 1, each gap as
    gap // 65535 escapes then gap % 65535."""
    gaps = np.diff(index, prepend=-1) - 1
    escapes, rest = np.divmod(gaps, _ESCAPE)
    tokens = np.full(int(escapes.sum()) + len(index), _ESCAPE, np.uint16)
    tokens[np.cumsum(escapes + 1) - 1] = rest
    return tokens


def _gap_positions(tokens: np.ndarray) -> np.ndarray:
    escape = tokens == _ESCAPE
    advance = np.where(escape, _ESCAPE, tokens.astype(np.int64) + 1)
    return (np.cumsum(advance) - 1)[~escape]


def _gaps_zstd_encode(old: np.ndarray, new: np.ndarray) -> bytes:
    index = np.flatnonzero(old != new)
    tokens = _gap_tokens(index)
    body = _LENGTH.pack(len(tokens)) + tokens.tobytes() + new[index].tobytes()
    return zstandard.ZstdCompressor(level=3).compress(body)


def _gaps_zstd_decode(old: np.ndarray, payload: memoryview) -> np.ndarray:
    body = zstandard.ZstdDecompressor().decompress(payload)
    (count,) = _LENGTH.unpack_from(body)
    tokens = np.frombuffer(body, np.uint16, count, offset=_LENGTH.size)
    index = _gap_positions(tokens)
    out = old.copy()
    out[index] = np.frombuffer(body, old.dtype, len(index), offset=_LENGTH.size + 2 * count)
    return out


def _zipnn(itemsize: int):
    """A ZipNN instance in delta mode for one element width (one per call: it keeps
    per-call header state)."""
    try:
        from zipnn import ZipNN
    except ImportError as e:
        raise BaselineUnavailable("zipnn_delta needs the zipnn package: pip install zipnn") from e
    names = {2: "bfloat16", 4: "float32"}
    if itemsize not in names:
        raise BaselineUnavailable(f"zipnn_delta codes 2- and 4-byte floats, not {itemsize}-byte")
    return ZipNN(
        input_format="byte",
        bytearray_dtype=names[itemsize],
        delta_compressed_type="byte",
        threads=1,
    )


def _zipnn_encode(old: np.ndarray, new: np.ndarray) -> bytes:
    return bytes(_zipnn(old.itemsize).compress(new.tobytes(), delta_second_data=old.tobytes()))


def _zipnn_decode(old: np.ndarray, payload: memoryview) -> np.ndarray:
    zipnn = _zipnn(old.itemsize)
    data = zipnn.decompress(bytes(payload), delta_second_data=old.tobytes())
    return np.frombuffer(data, old.dtype).copy()


BASELINES = (
    _per_tensor("raw_bf16", lambda old, new: new, _raw_decode),
    _per_tensor("index_value", _index_value_encode, _index_value_decode),
    _per_tensor("xor_zstd1", _xor_zstd1_encode, _xor_zstd1_decode),
    _per_tensor("gaps_zstd", _gaps_zstd_encode, _gaps_zstd_decode),
    _per_tensor("zipnn_delta", _zipnn_encode, _zipnn_decode),
)
"""Every baseline, in the order the benchmark reports them."""
