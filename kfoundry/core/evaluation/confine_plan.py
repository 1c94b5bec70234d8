"""What confinement is asked to do and what it did: the plan, the report, the protections, the step recorder."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

PROTECTIONS = (
    "pid_namespace",
    "network",
    "filesystem",
    "environment",
    "unprivileged",
    "no_new_privs",
    "limits",
    "scratch_cap",
)


DEFAULT_ENV_ALLOW: tuple[str, ...] = (
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "PATH",
    "TERM",
    "OMP_*",
    "KMP_*",
    "GOMP_*",
    "MKL_*",
    "OPENBLAS_*",
    "POCL_*",
    "PYOPENCL_*",  # pyopencl sets PYOPENCL_HOME on import; its ICD loader dereferences it
    "OCL_ICD_*",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_MODULE_LOADING",
    "NVIDIA_*",
    "HIP_*",
    "ROCR_*",
    "HSA_*",
    "SYCL_*",
    "ONEAPI_*",
    "TRITON_*",
    "KF_LOAD_PLUGINS",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "PYTHONIOENCODING",
)


#: Variables whose name contains one of these (case-insensitive) are never passed on.
ENV_DENY = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


NOBODY = 65534


SCRATCH = "/scratch"


@dataclass(frozen=True)
class ConfinementPlan:
    """What the confined process may see and use."""

    scratch_mb: int = 512
    readable: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    env_allow: tuple[str, ...] = DEFAULT_ENV_ALLOW
    env_set: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    keep_fds: tuple[int, ...] = ()
    max_processes: int = 512
    #: uid/gid to drop to when started as root (None: nobody). A uid of its own per concurrent job keeps
    #: the per-user process limit from being shared: one job's fork bomb cannot starve another's.
    uid: int | None = None
    max_open_files: int = 256
    max_file_mb: int = 256
    memory_mb: int | None = None
    cpu_seconds: int | None = None
    #: Bring the private network namespace's loopback up (a profiler and its target talk over it).
    loopback: bool = False


@dataclass
class ConfinementReport:
    """What :func:`confine` put in force; ``notes`` say why for each protection that is not."""

    scratch: str
    in_force: dict[str, bool]
    notes: list[str]

    def missing(self) -> list[str]:
        """Names of the protections not in force."""
        return [name for name in PROTECTIONS if not self.in_force.get(name)]


@dataclass
class Protection:
    """One protection as :func:`probe` found it, tested for real."""

    name: str
    in_force: bool
    detail: str


class _Recorder:
    def __init__(self) -> None:
        self.in_force: dict[str, bool] = dict.fromkeys(PROTECTIONS, False)
        self.notes: list[str] = []

    def fail(self, name: str, why: str) -> None:
        self.in_force[name] = False
        self.notes.append(f"{name}: {why}")


def env_allowed(name: str, allow: Iterable[str]) -> bool:
    """Whether ``name`` passes the allow-list (names or ``PREFIX*``) and matches no :data:`ENV_DENY` word."""
    upper = name.upper()
    if any(word in upper for word in ENV_DENY):
        return False
    return any(name.startswith(a[:-1]) if a.endswith("*") else name == a for a in allow)
