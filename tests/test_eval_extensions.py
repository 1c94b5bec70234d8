"""What a candidate-built library may import: compute-by-library symbols and run-time lookups are offences."""

from __future__ import annotations

from kfoundry.core.evaluation.extensions import offending_symbols


def test_run_time_lookups_and_aten_library_handles_are_offences() -> None:
    names = [
        "dlsym",
        "cuGetProcAddress_v2",
        "_ZN2at4cuda24getCurrentCUDABlasHandleEv",
        "cublasSgemm_v2",
        "_ZN2at4_ops2mm4callERKNS_6TensorES4_",
    ]
    assert offending_symbols(names) == [*names[:4], "at::mm"]


def test_what_an_honest_extension_imports_is_not() -> None:
    honest = [
        "cudaLaunchKernel",
        "__cudaRegisterFatBinary",
        "_ZN2at4cuda20getCurrentCUDAStreamEa",
        "_ZN2at4_ops5empty4callEN3c108ArrayRefINS2_6SymIntEEE",
        "PyModule_AddObject",
        "memcpy",
    ]
    assert offending_symbols(honest) == []


def test_tritons_own_launcher_stubs_may_look_up_libcuda() -> None:
    assert offending_symbols(["dlsym", "cuGetProcAddress"], lookups_allowed=True) == []
    assert offending_symbols(["dlsym", "cublasSgemm_v2"], lookups_allowed=True) == ["cublasSgemm_v2"]
