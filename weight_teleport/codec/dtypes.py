"""The dtypes the codec supports and how their bit patterns are laid out."""

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DtypeInfo:
    name: str
    torch_dtype: torch.dtype
    bits: int
    """Width of one element in bits."""
    exponent_bits: int
    """Width of the exponent field (0 for integer dtypes: no context classes)."""
    mantissa_bits: int
    """Width of the mantissa field (the exponent sits right above it)."""

    @property
    def is_float(self) -> bool:
        return self.exponent_bits > 0

    @property
    def nbytes(self) -> int:
        return self.bits // 8

    @property
    def uint_numpy(self) -> np.dtype:
        return np.dtype(f"<u{self.nbytes}")

    @property
    def int_torch(self) -> torch.dtype:
        return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[self.nbytes]


_ALL = [
    DtypeInfo("float64", torch.float64, 64, 11, 52),
    DtypeInfo("float32", torch.float32, 32, 8, 23),
    DtypeInfo("bfloat16", torch.bfloat16, 16, 8, 7),
    DtypeInfo("float16", torch.float16, 16, 5, 10),
    DtypeInfo("float8_e4m3fn", torch.float8_e4m3fn, 8, 4, 3),
    DtypeInfo("float8_e5m2", torch.float8_e5m2, 8, 5, 2),
    DtypeInfo("int64", torch.int64, 64, 0, 0),
    DtypeInfo("int32", torch.int32, 32, 0, 0),
    DtypeInfo("int16", torch.int16, 16, 0, 0),
    DtypeInfo("int8", torch.int8, 8, 0, 0),
    DtypeInfo("uint8", torch.uint8, 8, 0, 0),
    DtypeInfo("bool", torch.bool, 8, 0, 0),
]
BY_NAME = {d.name: d for d in _ALL}
BY_TORCH = {d.torch_dtype: d for d in _ALL}


def dtype_info(dtype: torch.dtype) -> DtypeInfo:
    """The layout of a torch dtype; ValueError for dtypes the codec does not carry."""
    try:
        return BY_TORCH[dtype]
    except KeyError:
        names = ", ".join(BY_NAME)
        raise ValueError(f"dtype {dtype} is not supported; supported dtypes: {names}") from None


def contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` detached, copied only where it is not contiguous: `contiguous()` on a tensor
    that already is costs a dispatch, and the codec makes views of every tensor of a model
    per call."""
    t = tensor.detach()
    return t if t.is_contiguous() else t.contiguous()


def as_uint(tensor: torch.Tensor) -> np.ndarray:
    """The bit patterns of a CPU tensor as a flat unsigned numpy array (no copy when contiguous)."""
    info = dtype_info(tensor.dtype)
    return contiguous(tensor).view(info.int_torch).reshape(-1).numpy().view(info.uint_numpy)
