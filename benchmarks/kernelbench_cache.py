"""What the KernelBench table's processes share: the backend set up the same way, kernels through an
on-disk compile cache, torch.compile's caches in one folder, and TF32 off.

The parallel warm-up's workers (``kernelbench_warm``) and the timing process call :func:`prepare` with
the same folder: the workers compile every recipe's kernels and run torch.compile once (Inductor's
FX-graph, autotuning and Triton caches land in the folder), so the timing process loads cubins /
program binaries and compiled graphs instead of compiling them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfoundry.core.evaluation.compile_cache import Artifact, CompileCache, compile_key
from kfoundry.core.evaluation.compile_service import runner_compile_info, supports_artifacts


@dataclass
class CacheStats:
    """Kernel loads served from the compile cache (``hits``) and compiled then stored (``misses``)."""

    hits: int = 0
    misses: int = 0


def inductor_env(folder: Path) -> None:
    """Point Inductor and Triton at ``folder`` (before the first torch.compile; children inherit it)."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "1"
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # the warm-up's pool is the parallelism


def tf32_off() -> dict[str, bool]:
    """Turn TF32 off for matmul and cuDNN (fp32 means fp32 for eager, torch.compile and cuBLAS) and
    return the flags as read back."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    flags = {
        "matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
    }
    if any(flags.values()):
        raise RuntimeError(f"kernelbench: TF32 is still on after turning it off: {flags}")
    return flags


def install_compile_cache(backend: Any, folder: Path) -> CacheStats:
    """Make ``backend.load`` look kernels up in a :class:`CompileCache` at ``folder`` (compiling and
    storing on a miss), keyed as the judge's compile service keys them. No-op stats where the backend
    has no artefact step."""
    stats = CacheStats()
    info = runner_compile_info(backend) if supports_artifacts(backend) else None
    if info is None:
        return stats
    cache = CompileCache(folder, 4 << 30)
    options = backend.options.model_dump(mode="json")
    compile_artifact, load_artifact = backend.compile_artifact, backend.load_artifact

    def load(
        source: str,
        *,
        defines: dict[str, Any] | None = None,
        build_options: list[str] | None = None,
    ) -> Any:
        key = compile_key(
            backend.name, source, defines, build_options, options, info["toolchain"], info["target"]
        )
        artifact = cache.get(key)
        if artifact is None:
            data, meta = compile_artifact(
                source, defines=defines, build_options=build_options, target=info["target"]
            )
            artifact = Artifact(data, meta)
            cache.put(key, artifact)
            stats.misses += 1
        else:
            stats.hits += 1
        return load_artifact(artifact.data, artifact.meta, defines=defines, build_options=build_options)

    backend.load = load
    return stats


def prepare(backend_name: str, folder: Path) -> tuple[Any, Any, CacheStats]:
    """The backend (device selected, made active for ``kfoundry.runtime.load``), its torch device and
    the compile cache's stats; TF32 off and torch.compile's caches under ``folder``."""
    inductor_env(folder)
    import warnings

    import torch

    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.")  # Inductor's advice: not rows

    from kfoundry.core.plugins import get_plugin
    from kfoundry.runtime import set_backend

    backend = get_plugin("backend", backend_name).build({})
    backend.require_device()
    tf32_off()
    stats = install_compile_cache(backend, folder / "kernels")
    set_backend(backend)
    return backend, torch.device(backend.torch_device), stats
