"""Parameter spaces: values, restrictions (expressions and callables), device limits, encoding."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from kfoundry.core.errors import KfError
from kfoundry.core.models import DeviceProfile, TunableSpace
from kfoundry.core.space import ParamSpace, SpaceError, detect_block_params

PARAMS = {"BLOCK_SIZE_X": [8, 16, 32, 64], "BLOCK_SIZE_Y": [1, 2, 4, 8], "TILE": [1, 2, 4]}


def device(**limits: object) -> DeviceProfile:
    return DeviceProfile(backend="opencl", name="test-device", **limits)  # type: ignore[arg-type]


def test_restrictions_as_expressions_and_callables() -> None:
    space = ParamSpace(PARAMS, ["BLOCK_SIZE_X * BLOCK_SIZE_Y <= 128", lambda c: c["TILE"] != 2])
    expected = [k for k in itertools.product(*PARAMS.values()) if k[0] * k[1] <= 128 and k[2] != 2]
    assert space.keys == expected
    assert space.size == len(expected) < space.product_size
    assert "is false" in (space.violation({"BLOCK_SIZE_X": 64, "BLOCK_SIZE_Y": 8, "TILE": 1}) or "")
    assert "not an allowed value" in (
        space.violation({"BLOCK_SIZE_X": 3, "BLOCK_SIZE_Y": 1, "TILE": 1}) or ""
    )


def test_constants_in_restrictions() -> None:
    space = ParamSpace(PARAMS, ["N % (BLOCK_SIZE_X * TILE) == 0"], constants={"N": 96})
    assert all(96 % (c["BLOCK_SIZE_X"] * c["TILE"]) == 0 for c in space.configs())


@pytest.mark.parametrize(
    ("restriction", "message"),
    [
        ("BLOCK_SIZE_X *", "syntax error"),
        ("BLOCK_X <= 4", "unknown name(s) BLOCK_X"),
        ("__import__('os')", "unknown"),
    ],
)
def test_bad_restriction_is_a_one_line_error(restriction: str, message: str) -> None:
    with pytest.raises(SpaceError, match=re.escape(message)) as info:
        ParamSpace(PARAMS, [restriction])
    assert isinstance(info.value, KfError) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("params", "message"),
    [({}, "at least one"), ({"A": []}, "no values"), ({"A": [1, 1]}, "twice"), ({"A-B": [1]}, "identifier")],
)
def test_bad_values(params: dict[str, list[int]], message: str) -> None:
    with pytest.raises(SpaceError, match=message):
        ParamSpace(params)


def test_nothing_valid_is_an_error() -> None:
    with pytest.raises(SpaceError, match="no configuration"):
        ParamSpace({"A": [1, 2]}, ["A > 5"]).keys  # noqa: B018


def test_block_params_detected_by_name() -> None:
    assert detect_block_params(["TILE", "block_size_y", "block_size_x"]) == ("block_size_x", "block_size_y")
    assert detect_block_params(["BLOCK_X", "BLOCK_Y", "BLOCK_Z", "WPT"]) == ("BLOCK_X", "BLOCK_Y", "BLOCK_Z")
    assert detect_block_params(["WG_SIZE", "VEC"]) == ("WG_SIZE",)
    assert detect_block_params(["TS", "WPT"]) == ()


def test_device_limits_prune_work_group_size_dimensions_and_local_memory() -> None:
    dev = device(max_work_group_size=64, max_work_item_sizes=[32, 64, 64], local_mem_bytes=512)
    space = ParamSpace(PARAMS, local_mem_expr="4 * BLOCK_SIZE_X * BLOCK_SIZE_Y * TILE", device=dev)
    for c in space.configs():
        assert c["BLOCK_SIZE_X"] * c["BLOCK_SIZE_Y"] <= 64
        assert c["BLOCK_SIZE_X"] <= 32
        assert 4 * c["BLOCK_SIZE_X"] * c["BLOCK_SIZE_Y"] * c["TILE"] <= 512
    assert space.size < ParamSpace(PARAMS).size
    assert "work-group size 128" in (
        space.violation({"BLOCK_SIZE_X": 32, "BLOCK_SIZE_Y": 4, "TILE": 1}) or ""
    )
    assert "dimension 0" in (space.violation({"BLOCK_SIZE_X": 64, "BLOCK_SIZE_Y": 1, "TILE": 1}) or "")
    assert "local memory" in (space.violation({"BLOCK_SIZE_X": 16, "BLOCK_SIZE_Y": 4, "TILE": 4}) or "")


def test_block_as_expressions_and_device_names_in_restrictions() -> None:
    params = {"TS": [8, 16, 32, 64], "WPT": [1, 2, 4, 8]}
    dev = device(max_work_group_size=256)
    space = ParamSpace(params, ["TS % WPT == 0"], block=["TS", "TS // WPT"], device=dev)
    assert all(c["TS"] * (c["TS"] // c["WPT"]) <= 256 for c in space.configs())
    assert {"TS": 64, "WPT": 1} not in list(space.configs())
    # a restriction naming a device field directly (as native tasks do)
    named = ParamSpace(params, ["TS * TS // WPT <= max_work_group_size"], device=dev)
    assert [c for c in named.configs()] == [c for c in space.configs()]
    # without a device such a restriction cannot be checked, so it does not prune
    assert ParamSpace(params, ["TS * TS // WPT <= max_work_group_size"]).size == 16


def test_from_tunable_and_for_device() -> None:
    tunable = TunableSpace(params={"BLOCK_X": [64, 128, 256, 512]}, restrictions=["BLOCK_X >= 128"])
    space = ParamSpace.from_tunable(tunable, device(max_work_group_size=256))
    assert [c["BLOCK_X"] for c in space.configs()] == [128, 256]
    wider = ParamSpace.from_tunable(tunable).for_device(device(max_work_group_size=1024))
    assert [c["BLOCK_X"] for c in wider.configs()] == [128, 256, 512]


def test_encoding_neighbours_and_members() -> None:
    space = ParamSpace({"A": [1, 2, 4], "B": ["x", "y"]})
    assert np.allclose(space.encode({"A": 4, "B": "x"}), [1.0, 0.0])
    assert space.encoded.shape == (6, 2)
    assert {tuple(n.values()) for n in space.neighbours({"A": 2, "B": "x"})} == {(1, "x"), (4, "x"), (2, "y")}
    sub = ParamSpace({"A": [1, 2, 4], "B": ["x", "y"]}, members=[(4, "y"), (1, "x")])
    assert sub.keys == [(1, "x"), (4, "y")]
    assert "not in the recorded space" in (sub.violation({"A": 2, "B": "x"}) or "")
