"""CUDA C kernels compiled at first use with NVRTC (the runtime compiler CUDA builds of torch
ship, `nvidia-cuda-nvrtc`) and launched through the driver API on torch's current stream.

Scalars a kernel takes are `long long` (Python ints pass as int64); tensors pass as their
data pointers; a `ctypes.Structure` (runtime/params.py) passes by value, as the struct the
kernel takes. A module is compiled once per device and set of defines."""

import ctypes
import functools
import glob
import os
import sys

import torch


def _open(names: list[str]) -> ctypes.CDLL:
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError(f"none of {names[:3]} could be loaded")


@functools.cache
def _nvrtc() -> ctypes.CDLL:
    major = (torch.version.cuda or "0").split(".")[0]
    try:
        return _open([f"libnvrtc.so.{major}", "libnvrtc.so"])
    except OSError:  # pip's nvidia-cuda-nvrtc wheel, where torch has not loaded it
        pattern = os.path.join("nvidia", "**", f"libnvrtc.so.{major}*")
        found = [f for root in sys.path for f in sorted(glob.glob(os.path.join(root, pattern), recursive=True))]
        return _open(found)


@functools.cache
def _driver() -> ctypes.CDLL:
    return _open(["libcuda.so.1", "libcuda.so"])


@functools.cache
def available() -> bool:
    """Whether NVRTC and the CUDA driver can be loaded (CUDA builds of torch only)."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        return False
    try:
        _nvrtc(), _driver()
    except OSError:
        return False
    return True


def _check_driver(code: int, what: str) -> None:
    if code:
        msg = ctypes.c_char_p()
        _driver().cuGetErrorString(code, ctypes.byref(msg))
        raise RuntimeError(f"{what} failed: CUDA error {code} ({(msg.value or b'?').decode()})")


@functools.cache
def _supported_archs() -> list[int]:
    """The compute capabilities (such as 90) this NVRTC compiles for."""
    lib, n = _nvrtc(), ctypes.c_int()
    lib.nvrtcGetNumSupportedArchs(ctypes.byref(n))
    archs = (ctypes.c_int * n.value)()
    lib.nvrtcGetSupportedArchs(archs)
    return list(archs)


@functools.cache
def capability(device) -> int:
    """A CUDA device's compute capability as 10 * major + minor (such as 90)."""
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def compiles_for(tensor: torch.Tensor) -> bool:
    """Whether kernels compiled here run on `tensor`'s device (a CUDA tensor, NVRTC and the
    driver loaded, NVRTC compiling for its GPU)."""
    return tensor.is_cuda and available() and supports(capability(tensor.device))


def supports(capability: int) -> bool:
    """Whether this NVRTC compiles for a GPU of compute capability `capability` (itself, or
    as PTX of an older one)."""
    return any(a <= capability for a in _supported_archs())


def compile_image(source: str, name: str, capability: int, options: list[str]) -> bytes:
    """CUDA C `source` compiled for a GPU of compute capability `capability` (such as 90):
    its CUBIN where this NVRTC knows the GPU, else PTX for the newest it knows, which the
    driver compiles for the GPU. Raises with NVRTC's log."""
    known = [a for a in _supported_archs() if a <= capability]
    if not known:
        raise RuntimeError(f"NVRTC compiles for none of the compute capabilities up to {capability}")
    cubin = capability in known
    arch = f"sm_{capability}" if cubin else f"compute_{max(known)}"
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", *options]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        if lib.nvrtcCompileProgram(prog, len(opts), arr):
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC could not compile {name}:\n{log.value.decode(errors='replace')}")
        get_size, get = (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if cubin else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
        size = ctypes.c_size_t()
        get_size(prog, ctypes.byref(size))
        image = ctypes.create_string_buffer(size.value)
        get(prog, image)
        return image.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _make_current(index: int) -> None:
    """Make device `index`'s primary context (torch's) current on this thread if none is."""
    drv, ctx = _driver(), ctypes.c_void_p()
    _check_driver(drv.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        _check_driver(drv.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), index), "cuDevicePrimaryCtxRetain")
        _check_driver(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


class Module:
    """CUDA C source with `#define`s, compiled for each device it is used on."""

    def __init__(self, source: str, name: str, defines: dict[str, int]):
        self.source, self.name = source, name
        self.options = [f"-D{k}={int(v)}" for k, v in defines.items()]
        self._modules: dict[int, ctypes.c_void_p] = {}
        self._functions: dict[tuple[int, str], ctypes.c_void_p] = {}

    def function(self, kernel: str, index: int) -> ctypes.c_void_p:
        """The compiled `kernel` on device `index` (compiling the source on first use)."""
        if index not in self._modules:
            image = compile_image(self.source, self.name, capability(index), self.options)
            module = ctypes.c_void_p()
            _check_driver(_driver().cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
            self._modules[index] = module
        if (index, kernel) not in self._functions:
            func = ctypes.c_void_p()
            _check_driver(
                _driver().cuModuleGetFunction(ctypes.byref(func), self._modules[index], kernel.encode()),
                f"cuModuleGetFunction({kernel})",
            )
            self._functions[index, kernel] = func
        return self._functions[index, kernel]

    def launch(self, kernel: str, grid: int, block: int, args: list, device: torch.device, shared: int = 0) -> None:
        """Launch `kernel` on `grid` x `block` threads on `device`'s current torch stream, with
        `shared` bytes of dynamic shared memory (at most 48 KB)."""
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        keep = [
            a
            if isinstance(a, ctypes.Structure)
            else ctypes.c_void_p(a.data_ptr())
            if isinstance(a, torch.Tensor)
            else ctypes.c_longlong(int(a))
            for a in args
        ]
        params = (ctypes.c_void_p * len(keep))(*[ctypes.cast(ctypes.byref(k), ctypes.c_void_p) for k in keep])
        with torch.cuda.device(index):
            _make_current(index)
            func = self.function(kernel, index)
            stream = torch.cuda.current_stream(index).cuda_stream
            _check_driver(
                _driver().cuLaunchKernel(func, grid, 1, 1, block, 1, 1, shared, ctypes.c_void_p(stream), params, None),
                f"launch of {kernel}",
            )
