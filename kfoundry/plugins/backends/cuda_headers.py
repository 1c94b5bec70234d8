"""In-memory C headers for NVRTC, which ships none of the C library's.

Kernels written for nvcc often use ``INFINITY``, ``FLT_MAX``, ``uint32_t`` or ``#include <math.h>``
(nvcc's implicit ``cuda_runtime.h`` pulls these in). NVRTC gets the same names from these headers:
the prelude is pre-included in every program, the others answer the matching ``#include``.
"""

from __future__ import annotations

_STDINT = """#pragma once
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long long uint64_t; typedef long long intptr_t; typedef unsigned long long uintptr_t;
typedef long long intmax_t; typedef unsigned long long uintmax_t;
#define INT8_MAX 127
#define INT16_MAX 32767
#define INT32_MAX 2147483647
#define INT64_MAX 9223372036854775807LL
#define INT32_MIN (-INT32_MAX - 1)
#define INT64_MIN (-INT64_MAX - 1)
#define UINT8_MAX 255
#define UINT16_MAX 65535
#define UINT32_MAX 4294967295U
#define UINT64_MAX 18446744073709551615ULL
"""

_MATH = """#pragma once
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#ifndef HUGE_VALF
#define HUGE_VALF INFINITY
#endif
#ifndef M_PI
#define M_E 2.71828182845904523536
#define M_LN2 0.69314718055994530942
#define M_LN10 2.30258509299404568402
#define M_PI 3.14159265358979323846
#define M_PI_2 1.57079632679489661923
#define M_2_SQRTPI 1.12837916709551257390
#define M_SQRT2 1.41421356237309504880
#define M_SQRT1_2 0.70710678118654752440
#endif
"""

_FLOAT = """#pragma once
#define FLT_MAX 3.402823466e+38F
#define FLT_MIN 1.175494351e-38F
#define FLT_EPSILON 1.192092896e-07F
#define DBL_MAX 1.7976931348623158e+308
#define DBL_MIN 2.2250738585072014e-308
#define DBL_EPSILON 2.2204460492503131e-016
"""

_LIMITS = """#pragma once
#define CHAR_BIT 8
#define SCHAR_MAX 127
#define SHRT_MAX 32767
#define INT_MAX 2147483647
#define INT_MIN (-INT_MAX - 1)
#define UINT_MAX 4294967295U
#define LLONG_MAX 9223372036854775807LL
#define LLONG_MIN (-LLONG_MAX - 1)
#define ULLONG_MAX 18446744073709551615ULL
"""

PRELUDE_NAME = "kf_nvrtc_prelude.h"

#: Header name -> text, handed to ``nvrtcCreateProgram``.
HEADERS: dict[str, str] = {
    "stdint.h": _STDINT,
    "cstdint": _STDINT,
    "math.h": _MATH,
    "cmath": _MATH,
    "float.h": _FLOAT,
    "cfloat": _FLOAT,
    "limits.h": _LIMITS,
    "climits": _LIMITS,
    "assert.h": "#pragma once\n",
    "cassert": "#pragma once\n",
    PRELUDE_NAME: '#pragma once\n#include "stdint.h"\n#include "math.h"\n#include "float.h"\n#include "limits.h"\n',
}
