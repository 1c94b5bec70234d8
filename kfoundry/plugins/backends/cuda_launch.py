"""Load cubins into the device's primary context (the one PyTorch uses) and launch their kernels.

Kernels launch on PyTorch's current stream with the driver API (``cuda.bindings.driver``).
Arguments are checked against the kernel's parameter layout (``cuFuncGetParamInfo``): a tensor
goes as its device pointer, a Python int as a 4- or 8-byte integer and a float as float or double,
by the parameter's size; numpy scalars keep their type. A sticky device error (illegal address,
...) raises :class:`GpuFault`: the process's CUDA context is unusable afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import weakref
from typing import Any

from kfoundry.core.errors import BackendUnavailable

#: Driver errors after which the context is unusable and the process must be replaced.
STICKY_ERRORS = (
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
)
#: How PyTorch words the same errors.
_STICKY_TEXT = (
    "illegal memory access",
    "illegal instruction",
    "misaligned address",
    "invalid program counter",
    "unspecified launch failure",
    "device-side assert",
    "hardware stack error",
    "operation not permitted when stream is capturing",
    "an illegal",
    "uncorrectable ecc",
)


class GpuFault(RuntimeError):
    """A kernel faulted on the device; the CUDA context of this process is unusable afterwards."""

    sticky = True


class CudaLaunchError(RuntimeError):
    """A launch was refused (bad arguments, too many threads or too much shared memory)."""


def is_sticky_error(exc: BaseException) -> bool:
    """True when ``exc`` (ours or PyTorch's) reports an error that poisons the CUDA context."""
    if isinstance(exc, GpuFault):
        return True
    text = str(exc).lower()
    return any(name.lower() in text for name in STICKY_ERRORS) or any(t in text for t in _STICKY_TEXT)


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def error_name(code: Any) -> str:
    """``CUDA_ERROR_X: description`` for a driver result code."""
    drv = _driver()
    _, name = drv.cuGetErrorName(code)
    _, text = drv.cuGetErrorString(code)
    name_s = name.decode() if isinstance(name, bytes) else str(name)
    text_s = text.decode() if isinstance(text, bytes) else str(text)
    return f"{name_s}: {text_s}"


def check(result: Any, what: str) -> Any:
    """Unpack a driver call's ``(CUresult, *values)``; raise on failure (GpuFault when sticky)."""
    code, *values = result if isinstance(result, tuple) else (result,)
    if int(code) != 0:
        message = f"{what} failed: {error_name(code)}"
        if any(name in message for name in STICKY_ERRORS):
            raise GpuFault(message)
        raise CudaLaunchError(message)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def driver_device_count() -> tuple[int, str]:
    """Number of CUDA devices the driver sees, and why none when it sees none."""
    try:
        drv = _driver()
        check(drv.cuInit(0), "cuInit")
        return int(check(drv.cuDeviceGetCount(), "cuDeviceGetCount")), ""
    except ImportError:
        return 0, "cuda-python is not installed (pip install 'kfoundry[cuda]')"
    except Exception as exc:  # no libcuda, no device, driver too old
        text = str(exc)
        if "libcuda" in text:
            return 0, "no CUDA driver on this machine (libcuda.so.1 not found)"
        return 0, f"no CUDA device usable ({text})"


class PrimaryContext:
    """The primary context of one device, made current on each thread that launches."""

    _instances: dict[int, PrimaryContext] = {}
    _lock = threading.Lock()

    def __init__(self, index: int) -> None:
        drv = _driver()
        check(drv.cuInit(0), "cuInit")
        self.index = index
        self.device = check(drv.cuDeviceGet(index), "cuDeviceGet")
        self.context = check(drv.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self._local = threading.local()

    @classmethod
    def get(cls, index: int) -> PrimaryContext:
        with cls._lock:
            if index not in cls._instances:
                cls._instances[index] = cls(index)
            return cls._instances[index]

    def make_current(self) -> None:
        if getattr(self._local, "current", False):
            return
        check(_driver().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self._local.current = True


_INT_KINDS: dict[int, type[ctypes._SimpleCData]] = {
    1: ctypes.c_int8,
    2: ctypes.c_int16,
    4: ctypes.c_int32,
    8: ctypes.c_int64,
}
#: The range a Python int must fit for a parameter of each size (signed or unsigned spelling).
_INT_RANGE = {n: (-(1 << (8 * n - 1)), (1 << (8 * n)) - 1) for n in _INT_KINDS}


def _int_arg(value: int, size: int | None, position: int) -> ctypes._SimpleCData:
    """A Python int as a ``size``-byte integer; one that does not fit is refused, never wrapped."""
    size = size or 4
    kind = _INT_KINDS.get(size)
    if kind is None:
        raise CudaLaunchError(f"argument {position}: an int for a {size}-byte parameter")
    low, high = _INT_RANGE[size]
    if not low <= value <= high:
        raise CudaLaunchError(f"argument {position}: {value} does not fit a {size}-byte parameter")
    return kind(value)


def _pack(value: Any, size: int | None, position: int) -> ctypes._SimpleCData | ctypes.Array[Any]:
    """One kernel argument as a ctypes object of the parameter's size."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        if value.device.type != "cuda":
            raise CudaLaunchError(
                f"argument {position}: a {value.device.type} tensor; CUDA kernels take GPU tensors"
            )
        if size not in (None, 8):
            raise CudaLaunchError(f"argument {position}: a tensor passed for a {size}-byte parameter")
        return ctypes.c_uint64(value.data_ptr())
    if isinstance(value, np.generic):
        raw = value.tobytes()
        if size is not None and len(raw) != size:
            raise CudaLaunchError(
                f"argument {position}: {value.dtype} ({len(raw)} bytes) for a {size}-byte parameter"
            )
        return (ctypes.c_char * len(raw)).from_buffer_copy(raw)
    if isinstance(value, bool):
        return {1: ctypes.c_uint8, 8: ctypes.c_uint64}.get(size or 4, ctypes.c_int32)(int(value))
    if isinstance(value, int):
        return _int_arg(value, size, position)
    if isinstance(value, float):
        if size == 2:
            return (ctypes.c_char * 2).from_buffer_copy(np.float16(value).tobytes())
        if size not in (None, 4, 8):
            raise CudaLaunchError(f"argument {position}: a float for a {size}-byte parameter")
        return ctypes.c_double(value) if size == 8 else ctypes.c_float(value)
    raise CudaLaunchError(f"argument {position}: cannot pass a {type(value).__name__} to a CUDA kernel")


def _dims(value: int | tuple[int, ...] | list[int], what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3 or any(not 1 <= d < 1 << 31 for d in dims):
        raise CudaLaunchError(f"{what} must be 1 to 3 positive sizes, got {value!r}")
    return (*dims, *(1,) * (3 - len(dims)))  # type: ignore[return-value]


class CudaKernel:
    """One kernel of a loaded module: ``kernel(*args, grid=(..), block=(..), shared_mem=0, stream=None)``."""

    def __init__(self, program: LoadedProgram, function: Any, name: str) -> None:
        self._program = program  # keeps the module loaded while the kernel lives
        self.function = function
        self.name = name
        self.param_sizes = self._param_sizes()
        #: the dynamic shared memory a launch may ask for without raising the limit (read from the driver
        #: on the first launch that asks for any: 48 KB less the kernel's static shared memory)
        self._dynamic_shared_limit: int | None = None
        self._handle = int(function)  # the CUfunction's value, for the direct driver call
        self._allow_wide_clusters()

    def _allow_wide_clusters(self) -> None:
        """A kernel compiled for a cluster of more than 8 blocks (``__cluster_dims__(16, 1, 1)``) launches
        only once the function allows a non-portable cluster size (sm_90 has up to 16); the driver says
        the compiled cluster shape. Nothing happens for other kernels or where the driver lacks these."""
        drv = _driver()
        attr = drv.CUfunction_attribute
        names = (
            "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH",
            "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT",
            "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH",
        )
        allow = getattr(attr, "CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED", None)
        if allow is None or not all(hasattr(attr, n) for n in names):
            return
        blocks = 1
        for n in names:
            code, value = drv.cuFuncGetAttribute(getattr(attr, n), self.function)
            if int(code) != 0:
                return
            blocks *= max(1, int(value))
        if blocks > 8:
            check(drv.cuFuncSetAttribute(self.function, allow, 1), "allowing a cluster of over 8 blocks")

    def _param_sizes(self) -> list[int] | None:
        drv = _driver()
        if not hasattr(drv, "cuFuncGetParamInfo"):
            return None
        sizes: list[int] = []
        for index in range(4096):
            code, _offset, size = drv.cuFuncGetParamInfo(self.function, index)
            if int(code) != 0:
                return sizes if index else ([] if code == drv.CUresult.CUDA_ERROR_INVALID_VALUE else None)
            sizes.append(int(size))
        return sizes

    def attributes(self) -> dict[str, int]:
        """Registers, static shared memory, local (stack) memory and max threads per block, from the driver."""
        drv = _driver()
        attr = drv.CUfunction_attribute
        wanted = {
            "registers": attr.CU_FUNC_ATTRIBUTE_NUM_REGS,
            "shared_bytes": attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            "local_bytes": attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            "const_bytes": attr.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
            "max_threads_per_block": attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        }
        return {
            key: int(check(drv.cuFuncGetAttribute(a, self.function), "cuFuncGetAttribute"))
            for key, a in wanted.items()
        }

    def __call__(
        self,
        *args: Any,
        grid: int | tuple[int, ...] = 1,
        block: int | tuple[int, ...] = 1,
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        import torch

        drv = _driver()
        self._program.context.make_current()
        sizes = self.param_sizes
        if sizes is not None and len(args) != len(sizes):
            raise CudaLaunchError(f"kernel {self.name} takes {len(sizes)} arguments, got {len(args)}")
        packed = _pack_all(args, sizes, torch.Tensor)
        pointers = (ctypes.c_void_p * max(1, len(packed)))(*[ctypes.addressof(p) for p in packed])
        gx, gy, gz = _dims(grid, "grid")
        bx, by, bz = _dims(block, "block")
        if shared_mem and self._dynamic_shared_limit is None:
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self._dynamic_shared_limit = int(
                check(drv.cuFuncGetAttribute(attr, self.function), "reading the shared-memory limit")
            )
        if shared_mem and shared_mem > (self._dynamic_shared_limit or 0):
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(
                drv.cuFuncSetAttribute(self.function, attr, int(shared_mem)),
                "raising the shared-memory limit",
            )
            self._dynamic_shared_limit = int(shared_mem)
        if stream is None:
            stream = _current_stream(torch, self._program.context.index)
        params = ctypes.addressof(pointers) if packed else 0
        direct = _direct_launch()
        if direct is not None:
            raw = int(stream)  # a CUstream's int() is its handle
            code = direct(self._handle, gx, gy, gz, bx, by, bz, int(shared_mem), raw, params, None)
            if code != 0:
                check((drv.CUresult(code),), f"launching {self.name}")
            return
        handle = stream if isinstance(stream, drv.CUstream) else _stream_handle(drv, int(stream))
        check(
            drv.cuLaunchKernel(self.function, gx, gy, gz, bx, by, bz, int(shared_mem), handle, params, 0),
            f"launching {self.name}",
        )


def _pack_all(args: tuple[Any, ...], sizes: list[int] | None, tensor: Any) -> list[Any]:
    """Every argument packed; device tensors and fitting ints (nearly all of them) without the
    general path's checks, which a launch of a small kernel would otherwise spend most of its time on."""
    packed: list[Any] = []
    for i, a in enumerate(args):
        size = sizes[i] if sizes is not None else None
        kind = type(a)
        if kind is int and size in (4, 8):
            packed.append(_int_arg(a, size, i))
        elif isinstance(a, tensor) and a.is_cuda and size in (None, 8):
            packed.append(ctypes.c_uint64(a.data_ptr()))
        else:
            packed.append(_pack(a, size, i))
    return packed


def _current_stream(torch: Any, index: int) -> int:
    """PyTorch's current stream on device ``index`` as a raw handle (the C call Inductor's launchers use)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(index))
    return int(torch.cuda.current_stream(index).cuda_stream)


_STREAMS: dict[int, Any] = {}
_DIRECT: list[Any] = []


def _direct_launch() -> Any:
    """``cuLaunchKernel`` of the driver library cuda-python already loaded, called through ctypes.

    The bindings' own call converts every argument through Python objects, and a small KernelBench
    problem runs on the device for less time than a launch takes on the host. None where the symbol
    cannot be found, or where ``KF_CUDA_LAUNCH=bindings`` asks for the bindings' call.
    """
    if not _DIRECT:
        fn = None
        if os.environ.get("KF_CUDA_LAUNCH", "") != "bindings":
            try:
                fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
            except (OSError, AttributeError):
                fn = None
        if fn is not None:
            u = ctypes.c_uint
            fn.argtypes = [
                ctypes.c_void_p,
                u,
                u,
                u,
                u,
                u,
                u,
                u,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_void_p,
            ]
            fn.restype = ctypes.c_int
        _DIRECT.append(fn)
    return _DIRECT[0]


def _stream_handle(drv: Any, raw: int) -> Any:
    """The driver's ``CUstream`` for a raw handle, made once per stream."""
    handle = _STREAMS.get(raw)
    if handle is None:
        if len(_STREAMS) > 256:  # streams come and go in a long process: keep the table small
            _STREAMS.clear()
        handle = _STREAMS[raw] = drv.CUstream(raw)
    return handle


class LoadedProgram:
    """A cubin loaded as a driver module in one device's primary context."""

    def __init__(self, cubin: bytes, context: PrimaryContext) -> None:
        drv = _driver()
        self.context = context
        context.make_current()
        self.module = check(drv.cuModuleLoadData(cubin), "cuModuleLoadData")
        weakref.finalize(self, _unload, self.module)

    def function_names(self) -> list[str]:
        """Every kernel symbol in the module (mangled for C++ names)."""
        drv = _driver()
        count = int(check(drv.cuModuleGetFunctionCount(self.module), "cuModuleGetFunctionCount"))
        functions = check(drv.cuModuleEnumerateFunctions(count, self.module), "cuModuleEnumerateFunctions")
        names = []
        for fn in functions if isinstance(functions, list | tuple) else [functions]:
            name = check(drv.cuFuncGetName(fn), "cuFuncGetName")
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names

    def kernel(self, symbol: str, name: str) -> CudaKernel:
        function = check(
            _driver().cuModuleGetFunction(self.module, symbol.encode()), f"finding kernel {symbol}"
        )
        return CudaKernel(self, function, name)


def _unload(module: Any) -> None:
    with contextlib.suppress(Exception):  # interpreter shutdown or a dead context: nothing to free
        _driver().cuModuleUnload(module)


def require_torch_cuda(index: int) -> None:
    """Fail in one line when PyTorch cannot use CUDA device ``index`` (kernel arguments live there)."""
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable(
            f"cuda: PyTorch {torch.__version__} cannot use a CUDA device here (CPU-only build or no device)"
        )
    if index >= torch.cuda.device_count():
        raise BackendUnavailable(f"cuda: no device {index} (PyTorch sees {torch.cuda.device_count()})")
