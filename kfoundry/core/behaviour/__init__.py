"""Behaviour descriptors measured from the compiled kernel (issue 17), and the run's descriptor space.

- :mod:`.axes`: the axes a run may choose (``search.options.descriptors``) and their binning;
- :mod:`.space`: a run's :class:`~.space.DescriptorSpace` (axes, grid, each candidate's cell);
- :mod:`.measure`: per-language measurers (CUDA, HIP, OpenCL) that compile a candidate's kernels;
- :mod:`.mix`, :mod:`.cuda`, :mod:`.amdgpu`, :mod:`.llvm_ir`: listings and their instruction mix;
- :mod:`.features`: features derived from a mix and a resource report;
- :mod:`.registry`: how a backend registers its language's descriptors; :mod:`.run`: the loop's side.

The package imports nothing at import time, so core modules may import :mod:`.axes` cheaply.
"""
