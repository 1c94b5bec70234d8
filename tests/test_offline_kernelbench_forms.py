"""KernelBench's own ways of writing a problem reach the offline generator intact.

``super(Model, self).__init__()``, ``height, width = 32, 32`` and a tuple constant derived from an
overridden one (``bias_shape = (out_features,)``) are how KernelBench writes most Level-2 files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.lower import init_source
from kfoundry.runtime import load, synchronize

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
SMALL: dict[str, dict[str, int]] = json.loads((DATA / "small_shapes.json").read_text())


def test_tuple_constants_can_be_overridden() -> None:
    problem = load_problem(DATA / "level2/conv2d_mish_mish.py", {"height": 7})
    assert problem.make_inputs(1)[0].shape[2] == 7
    problem = load_problem(DATA / "level2/conv2d_scaling_min.py", {"height": 9, "width": 5})
    assert tuple(problem.make_inputs(1)[0].shape[2:]) == (9, 5)


def test_the_parameter_holder_keeps_super_model_self() -> None:
    src = (DATA / "level2/matmul_divide_sum_scaling.py").read_text()
    namespace: dict[str, object] = {}
    exec(init_source(src, {"hidden_size": 3}), namespace)
    holder = namespace["_RefInit"](10, 3, 1.5)  # type: ignore[operator]
    assert holder.weight.shape == (3, 10)


@pytest.mark.parametrize(
    "key",
    [
        "level2/gemm_add_relu.py",  # bias_shape = (out_features,): derived from an override
        "level2/matmul_min_subtract.py",  # super(Model, self), a 0-d parameter
        "level2/conv_transpose2d_gap_bias_logsumexp_sum_multiply.py",  # height, width = 32, 32
    ],
)
def test_kernelbench_forms_are_lowered_and_correct_on_pocl(key: str) -> None:
    from kfoundry.core.plugins import get_plugin
    from kfoundry.runtime import set_backend

    set_backend(get_plugin("backend", "opencl").build({}))
    problem = load_problem(DATA / key, SMALL[key])
    torch.manual_seed(0)
    ref = problem.make_reference()
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = ref(*inputs)
    recipe = max(OfflineGenerator().recipes(problem.summary(), "opencl"), key=lambda r: r.rank)
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())  # type: ignore[operator]
    with torch.no_grad():
        got = model(*inputs)
        synchronize()
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)


def test_dropout_in_training_mode_is_a_fresh_random_mask_on_pocl() -> None:
    from kfoundry.core.generator import ProblemSummary
    from kfoundry.core.plugins import get_plugin
    from kfoundry.runtime import set_backend

    set_backend(get_plugin("backend", "opencl").build({}))
    src = (
        "import torch\nimport torch.nn as nn\n\nn = 4096\n\n\nclass Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.d = nn.Dropout(0.3)\n\n"
        "    def forward(self, x):\n        return self.d(x)\n\n\n"
        "def get_inputs():\n    return [torch.rand(2, n) + 1.0]\n\n\ndef get_init_inputs():\n    return []\n"
    )
    recipe = max(
        OfflineGenerator().recipes(ProblemSummary(name="drop", reference_source=src), "opencl"),
        key=lambda r: r.rank,
    )
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    model = namespace["ModelNew"]()  # type: ignore[operator]
    x = torch.rand(2, 4096) + 1.0
    with torch.no_grad():
        a, b = model(x), model(x)
        synchronize()
    for y in (a, b):
        kept = y != 0
        assert 0.25 < 1.0 - kept.float().mean().item() < 0.35
        torch.testing.assert_close(y[kept], x[kept] / 0.7)
    assert not torch.equal(a, b)  # a new mask per call
