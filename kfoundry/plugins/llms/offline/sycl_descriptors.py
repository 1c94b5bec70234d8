"""SYCL's static behaviour descriptors (moved to :mod:`kfoundry.core.descriptors_sycl`; kept as an alias)."""

from __future__ import annotations

from kfoundry.core.descriptors_sycl import SYCL_PATTERNS, sycl_descriptors

__all__ = ["SYCL_PATTERNS", "sycl_descriptors"]
