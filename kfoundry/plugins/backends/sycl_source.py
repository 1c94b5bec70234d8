"""SYCL source handling: template parameters as ``#define`` lines, the kernels' signatures, the
compiler log mapped back to the source.

Defines are inserted after the source's last ``#include`` (a ``-D`` on the command line would also
rewrite identifiers inside the SYCL headers: ``-DWG=64`` breaks them), and the log's line numbers are
mapped back to the source's (the run-time compiler ignores ``#line``). Kernels are the free functions
declared with ``SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<N>))``; their
parameters are parsed so scalars can be passed with the type the kernel declares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kfoundry.core.backend import CompileFailed
from kfoundry.core.models import ParamValue

_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.MULTILINE)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_KERNEL = re.compile(
    r"SYCL_EXT_ONEAPI_FUNCTION_PROPERTY\s*\(\s*\(\s*[\w:]*?\b(nd_range_kernel|single_task_kernel)\s*"
    r"(?:<\s*(\d)\s*>)?\s*\)\s*\)[^;{}()]*?\bvoid\s+(\w+)\s*\("
)
_QUALIFIERS = {"const", "volatile", "restrict", "__restrict", "__restrict__", "struct"}
_SCALAR_KINDS: dict[str, str] = {
    "int": "i32", "signed": "i32", "signed int": "i32", "int32_t": "i32",
    "unsigned": "u32", "unsigned int": "u32", "uint32_t": "u32", "uint": "u32",
    "long": "i64", "long int": "i64", "long long": "i64", "long long int": "i64", "int64_t": "i64",
    "ptrdiff_t": "i64",
    "unsigned long": "u64", "unsigned long int": "u64", "unsigned long long": "u64", "uint64_t": "u64",
    "size_t": "u64",
    "short": "i16", "short int": "i16", "int16_t": "i16", "unsigned short": "u16", "uint16_t": "u16",
    "char": "i8", "signed char": "i8", "int8_t": "i8", "unsigned char": "u8", "uint8_t": "u8", "bool": "u8",
    "float": "f32", "double": "f64", "half": "f16", "sycl::half": "f16",
}  # fmt: skip


@dataclass(frozen=True)
class Param:
    """One kernel parameter as declared: ``kind`` is ptr / local / a scalar kind / None (unknown type)."""

    name: str
    type: str
    kind: str | None


@dataclass(frozen=True)
class KernelSignature:
    """A kernel's name, its ``nd_range_kernel<N>`` dimension (None: not declared) and parameters."""

    name: str
    ndim: int | None
    params: tuple[Param, ...]


def _define_value(value: ParamValue) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        if value != value:
            return '(__builtin_nanf(""))'
        if value in (float("inf"), float("-inf")):
            return "(__builtin_inff())" if value > 0 else "(-__builtin_inff())"
        return f"{value!r}f"
    return str(value)


def insert_defines(source: str, defines: dict[str, ParamValue] | None) -> tuple[str, int, int]:
    """``source`` with the defines inserted, the line they start at and how many lines were inserted."""
    if not defines:
        return source, 0, 0
    lines = []
    for name, value in defines.items():
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise CompileFailed(f"sycl: define name {name!r} is not an identifier")
        lines.append(f"#define {name} {_define_value(value)}")
    includes = list(_INCLUDE.finditer(source))
    if not includes:
        return "\n".join(lines) + "\n" + source, 1, len(lines)
    at = includes[-1].end()
    first = source.count("\n", 0, at) + 2
    return source[:at] + "\n" + "\n".join(lines) + source[at:], first, len(lines)


def with_defines(source: str, defines: dict[str, ParamValue] | None) -> str:
    """``source`` with a ``#define`` line per entry after its last ``#include``."""
    return insert_defines(source, defines)[0]


def source_lines(log: str, first: int, count: int) -> str:
    """The compiler's line numbers mapped back to the source's (the runtime compiler ignores ``#line``)."""
    if not count:
        return log

    def fix(m: re.Match[str]) -> str:
        line = int(m.group(2))
        return f"{m.group(1)}{line - count if line >= first + count else line}"

    return re.sub(r"(rtc_\d+\.cpp:)(\d+)", fix, log)


def _split_params(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip() and p.strip() != "void"]


def _param(text: str, defines: dict[str, ParamValue]) -> Param:
    words = re.findall(r"[\w:]+", text.split("=")[0])
    name = words[-1] if len(words) > 1 else ""
    if "local_accessor" in text:
        return Param(name, text, "local")
    if "work_group_memory" in text:
        return Param(name, text, "unsupported")
    if "*" in text or "[" in text:
        return Param(name, text, "ptr")
    type_words = [w for w in (words[:-1] if name else words) if w not in _QUALIFIERS]
    type_words = [str(defines.get(w, w)) for w in type_words]
    type_name = " ".join(w.removeprefix("std::") for w in type_words)
    if "*" in type_name:
        return Param(name, text, "ptr")
    return Param(name, text, _SCALAR_KINDS.get(type_name))


def parse_kernels(source: str, defines: dict[str, ParamValue] | None = None) -> list[KernelSignature]:
    """The free-function kernels (``SYCL_EXT_ONEAPI_FUNCTION_PROPERTY``) declared in ``source``."""
    text = _COMMENT.sub(" ", source)
    out = []
    for m in _KERNEL.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        params = tuple(_param(p, defines or {}) for p in _split_params(text[m.end() : i - 1]))
        ndim = int(m.group(2)) if m.group(2) else (1 if m.group(1) == "single_task_kernel" else None)
        out.append(KernelSignature(m.group(3), ndim, params))
    return out


def first_error(log: str) -> str:
    """The first error line of a build log, its file name replaced by "line" (else its first line)."""
    for line in log.splitlines():
        if "error:" in line:
            return re.sub(r"^.*?rtc_\d+\.cpp:", "line ", line.strip())
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    return lines[0] if lines else "build failed"
