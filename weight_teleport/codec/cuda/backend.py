"""The CUDA backend's interface (codec/backend.py), the same few functions as the CPU
backend's."""

from weight_teleport.codec import digest as D
from weight_teleport.codec import registry, streams
from weight_teleport.codec.items import EncodeItem, Encoded, walk_cuts
from weight_teleport.codec.cuda.runtime import nvcomp
from weight_teleport.codec.cuda.stage import staging
from weight_teleport.codec.cuda.stage.apply import bind
from weight_teleport.codec.cuda.encode import encoder
from weight_teleport.codec.cuda.encode.sparse_chunks import CODEC_ID
from weight_teleport.codec.cuda.config import NVCOMP_ALGORITHM, CudaCodecConfig
from weight_teleport.codec.cuda.kernels.digest import digest as _digest
from weight_teleport.codec.cuda.kernels.digest import word_sums
from weight_teleport.codec.cuda.encode.encoder import DEFAULT_CONFIG
from weight_teleport.codec.cuda.live import Live, encode_item, walk_bits
from weight_teleport.errors import UnsupportedFormatError

item = encode_item


def walk_item(name, info, new, old, sl, hint, chunk_elems: int) -> EncodeItem:
    """The item of a record over a walk (`new` and `old` in walk order, flattened by
    `walk_bits`), cut where `hint.bounds` fall, with a digest per chunk (receivers holding
    slices verify the chunks they stage alone), as the CPU backend's `walk_item`."""
    new, old = walk_bits(new, info), None if old is None else walk_bits(old, info)
    return encode_item(name, info, new, old, walk_cuts(sl, hint, new.numel(), chunk_elems), chunk_digests=True)


def encode(
    items: list[EncodeItem],
    chunk_elems: int,
    level: int,
    threads: int | None,
    config: CudaCodecConfig | None = None,
    pinned: bool = False,
    codec: str = registry.DEFAULT,
) -> Encoded:
    """The backend interface's encode: `config` (default `DEFAULT_CONFIG`) picks the stream
    coder (of `sparse` records); with `pinned` the payload is copied from the device into the
    pinned pack (of a `sparse` payload: `sparse_ac` chunks are laid out on the host)."""
    config = config or DEFAULT_CONFIG
    records, chunks, ready = encoder.encode(
        items, chunk_elems, level, threads, config=config, pinned=pinned, codec=codec
    )
    return Encoded(records, chunks, ready, ["raw", "zstd", *extra_stream_codecs(config)])


def check_stage(header, windows: dict) -> None:
    """UnsupportedFormatError unless this build stages the pack onto CUDA weights: records
    whole (cut or not: a record over a box stages against its box's walk view) or in part
    (`windows`: a receiver holding a slice, each run of chunks checked against its chunk
    digests), of stream codecs it decodes (`check_readable`)."""
    check_readable(header.stream_codecs)


def stage(
    lives: dict[str, Live],
    header,
    pack,
    check_base: bool,
    threads: int | None,
    windows: dict | None = None,
    config: CudaCodecConfig | None = None,
):
    """Decode and verify every chunk against the live weights on their device; nothing is
    written. `windows`: the records staged in part (codec/api.py); `config` picks nvCOMP's
    decompression backend."""
    return staging.stage(lives, header, pack, check_base, threads, config=config, windows=windows)


def digest(tensor) -> str:
    """The pack digest of a CUDA tensor's bytes, in hex (one reduction on its device)."""
    return D.to_hex(_digest(tensor))


def digests(tensors) -> list[str]:
    """The pack digests of CUDA tensors: one reduction per device, one read-back each."""
    out = [""] * len(tensors)  # every index is some device's
    by_device: dict = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for idx in by_device.values():
        sums = word_sums([tensors[i] for i in idx]).cpu().tolist()
        for i, s in zip(idx, sums):
            nbytes = tensors[i].numel() * tensors[i].element_size()
            out[i] = D.to_hex(D.finish(s & D.MASK64, nbytes))
    return out


def check_readable(stream_codecs: list[str]) -> None:
    """UnsupportedFormatError unless every stream codec named decodes here: the portable ones
    always (the CPU's zstd where nvCOMP is missing), the GPU-only ones with nvCOMP."""
    portable = {streams.NAMES[c] for c in streams.CPU_READABLE}
    unknown = set(stream_codecs) - portable - {streams.NAMES[c] for c in nvcomp.CODED}
    if unknown:
        raise UnsupportedFormatError(
            f"pack uses stream codecs {sorted(unknown)} that this build cannot decode; "
            "upgrade weight-teleport to read it"
        )
    gpu_only = set(stream_codecs) - portable
    if gpu_only and not nvcomp.available():
        raise UnsupportedFormatError(
            f"pack uses the GPU-only stream codecs {sorted(gpu_only)}, which need "
            "nvCOMP: pip install 'weight-teleport[cuda]'"
        )


def extra_stream_codecs(config: CudaCodecConfig) -> list[str]:
    """Stream codec names a pack written with `config` may use beyond raw and zstd."""
    return [] if config.portable else [streams.NAMES[CODEC_ID[NVCOMP_ALGORITHM[config.stream_coder]]]]


__all__ = [
    "DEFAULT_CONFIG",
    "EncodeItem",
    "Live",
    "bind",
    "check_readable",
    "check_stage",
    "digest",
    "digests",
    "encode",
    "extra_stream_codecs",
    "item",
    "stage",
    "walk_item",
]
