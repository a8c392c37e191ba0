"""A kernel's parameters as one struct: a `ctypes.Structure` on the host mirrors the CUDA C
struct the kernel takes by value, so a launch names each parameter instead of placing it in
a positional list (where one slip shifts every later pointer).

A mirror lists its fields in the CUDA struct's order, device pointers as `POINTER` and
`i64` scalars as `I64` (8 bytes each, so neither side pads). `layout_checks` gives
CUDA C a `static_assert` of the struct's size, which the modules that launch it append
to their source: a mirror that gains or loses a field fails to compile
(tests/codec/test_codec_warp_compile.py compiles them without a GPU, and
tests/codec/test_kernel_params.py checks the mirrors against the declarations parsed from the
source)."""

import ctypes
import re

import torch

POINTER, I64 = ctypes.c_void_p, ctypes.c_longlong


class KernelParams(ctypes.Structure):
    """Base of a host mirror: subclasses set `_fields_` and `CUDA_NAME`, the struct's name in
    the CUDA source."""

    CUDA_NAME = ""

    @classmethod
    def of(cls, **values) -> "KernelParams":
        """The struct with every field set by name: a tensor's data pointer for a `POINTER`
        field, an int for an `I64` one. TypeError for a field missing, unknown or of the
        wrong kind."""
        names = [field[0] for field in cls._fields_]
        missing, unknown = [n for n in names if n not in values], sorted(set(values) - set(names))
        if missing or unknown:
            raise TypeError(f"{cls.__name__}: missing fields {missing}, unknown fields {unknown}")
        out = {}
        for name, kind, *_ in cls._fields_:
            v = values[name]
            if kind is POINTER:
                if not isinstance(v, torch.Tensor):
                    raise TypeError(f"{cls.__name__}.{name} takes a tensor, got {type(v).__name__}")
                out[name] = v.data_ptr()
            else:
                if isinstance(v, torch.Tensor):
                    raise TypeError(f"{cls.__name__}.{name} takes an int, got a tensor")
                out[name] = int(v)
        params = cls(**out)
        params.values = {n: values[n] for n in names}  # in field order; keeps what the pointers point into
        return params

    @classmethod
    def layout_checks(cls) -> str:
        """A CUDA C static_assert that `CUDA_NAME` has this mirror's size. Field offsets
        follow from the order since every field is 8 bytes; that order is checked against
        the declaration by tests/codec/test_kernel_params.py (NVRTC builds without a host
        compiler's `offsetof` reject it in device code)."""
        s = cls.CUDA_NAME
        line = f'static_assert(sizeof({s}) == {ctypes.sizeof(cls)}, "{s}: size differs from its host mirror");'
        return "\n// host mirror check (codec/cuda/runtime/params.py)\n" + line + "\n"


_SIZES = {"i64": 8, "u64": 8, "long long": 8, "unsigned long long": 8, "int": 4, "unsigned": 4, "unsigned int": 4}


def declared_fields(source: str, name: str) -> list[tuple[str, str]]:
    """(type, field) of each field of `struct name { ... };` in CUDA C `source`, in order,
    such as ("const U*", "old"). One declarator a line is enough; `a, b` lists are split."""
    m = re.search(rf"\bstruct\s+{name}\s*\{{(.*?)\}};", source, re.S)
    if m is None:
        raise ValueError(f"no struct {name} in the source")
    body = re.sub(r"//[^\n]*", "", m.group(1))
    out = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        first, *rest = [p.strip() for p in decl.split(",")]
        head = re.match(r"(.*?[\s*])(\w+)$", first)
        if head is None:
            raise ValueError(f"cannot read the declaration {decl!r} of struct {name}")
        ctype = head.group(1).strip()
        out += [(ctype, head.group(2))] + [(ctype, r) for r in rest]
    return out


def declared_layout(source: str, name: str) -> tuple[list[tuple[str, int, int]], int]:
    """([(field, offset, size)], struct size) of `struct name` in `source` by C's natural
    alignment, for pointers (8 bytes) and the integer types of _SIZES."""
    fields, at, align = [], 0, 1
    for ctype, field in declared_fields(source, name):
        size = 8 if ctype.endswith("*") else _SIZES.get(ctype.removeprefix("const ").strip())
        if size is None:
            raise ValueError(f"struct {name}.{field}: no size known for type {ctype!r}")
        at = -(-at // size) * size
        fields.append((field, at, size))
        at, align = at + size, max(align, size)
    return fields, -(-at // align) * align
