"""The short family form (templates.simple): a decorated reference function is a KernelFamily,
found by its folder, whose definition errors are one line naming the file and the field, and
whose torch-made inputs, reference and checks accept right outputs and refuse wrong ones."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from templates import get_family
from templates.family import H100_LIMITS, TemplateError, check_outputs
from templates.simple import FamilyError, SimpleFamily, with_defines

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch (pip install '.[torch]')")

TEMPLATE = """extern "C" __global__ void scale(float* y, const float* x, int n) {
    int i = blockIdx.x * {{ THREADS }} + threadIdx.x;
    if (i < n) y[i] = 2.f * x[i];
}
"""
DEFINITION = """
from templates.simple import kernel_family

@kernel_family("scale.cu.j2", shape="N", dtypes=("fp32",), params=dict(THREADS=(256, 128, 2048)),
               inputs=dict(x="N"), outputs=dict(y="N"), args="y, x, N",
               grid=lambda p, s: -(-s.N // p.THREADS), block=lambda p, s: p.THREADS{extra})
def scale(x):
    return 2 * x
"""


def write_family(folder: Path, extra: str = "", template: str = TEMPLATE, body: str = DEFINITION) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scale.cu.j2").write_text(template)
    (folder / "__init__.py").write_text(body.replace("{extra}", extra))
    return folder


def test_a_decorated_reference_is_a_family_found_by_its_folder(tmp_path):
    family = get_family(str(write_family(tmp_path / "scale")))
    assert isinstance(family, SimpleFamily) and family.name == "scale" and family.kernel == "scale"
    problem = family.parse_problem("1000", "fp32")
    assert [c["THREADS"] for c in family.valid_configs(problem, H100_LIMITS)] == [256, 128]
    assert family.check(dict(THREADS=2048), problem, H100_LIMITS).startswith("threads:")
    assert "blockIdx.x * 128 " in family.render(dict(THREADS=128), problem)
    launch = family.launch(dict(THREADS=128), problem)
    assert launch.grid == (8, 1, 1) and launch.block == (128, 1, 1)
    assert [(a.kind, a.value) for a in launch.args] == [("buffer", "y"), ("buffer", "x"), ("i32", 1000)]
    spec, = family.outputs(problem)
    assert spec.shape == (1000,) and spec.element == "fp32" and spec.poison == 0x7FC0
    assert family.min_bytes(problem) == 8000 and family.input_shapes(problem) == {"x": ((1000,), "fp32")}
    for shape, dtype in (("10,10", "fp32"), ("0", "fp32"), ("ten", "fp32"), ("10", "fp16")):
        with pytest.raises(TemplateError):
            family.parse_problem(shape, dtype)


@pytest.mark.parametrize("extra, template, field, what", [
    (", constraints=lambda p, s, d: 1 // 0", TEMPLATE, "constraints", "ZeroDivisionError"),
    ("GRID", TEMPLATE, "grid", "AttributeError"),
    ("", TEMPLATE.replace("{{ THREADS }}", "{{ THREAD }}"), "template", "'THREAD' is undefined"),
    ("", TEMPLATE.replace("{{ THREADS }}", "{{ THREADS }"), "template", ""),
])
def test_a_wrong_function_or_template_is_one_line_naming_the_field(tmp_path, extra, template, field, what):
    body = DEFINITION.replace("-(-s.N // p.THREADS)", "s.M") if extra == "GRID" else DEFINITION
    family = get_family(str(write_family(tmp_path / "scale", "" if extra == "GRID" else extra, template, body)))
    problem = family.parse_problem("1000", "fp32")
    with pytest.raises(FamilyError) as error:
        family.render(dict(THREADS=128), problem)
        family.check(dict(THREADS=128), problem, H100_LIMITS)
    line = str(error.value)
    assert "\n" not in line and f": {field}" in line and what in line
    assert str(tmp_path / "scale") in line  # the file: the module or the template


@pytest.mark.parametrize("extra, field, what", [
    (", params=dict(THREADS=())", "params", "'THREADS' has no choices"),
    (", outputs=dict(y='N', z='N')", "args", "output 'z' is not among the kernel's arguments"),
    (", inputs=dict(x='N + M')", "inputs", "names 'M'"),
    (", dtypes=('fp8',)", "dtypes", "'fp8'"),
    (", suite=[('10,10', 'fp32')]", "suite", "malformed shape"),
])
def test_a_wrong_definition_is_refused_when_loaded(tmp_path, extra, field, what):
    body = DEFINITION.replace("params=dict(THREADS=(256, 128, 2048)),", "") if "params=" in extra else DEFINITION
    for name in ("outputs", "inputs", "dtypes"):
        if f"{name}=" in extra:
            body = body.replace({"outputs": "outputs=dict(y=\"N\"), ", "inputs": "inputs=dict(x=\"N\"), ",
                                 "dtypes": "dtypes=(\"fp32\",), "}[name], "")
    with pytest.raises(FamilyError) as error:
        get_family(str(write_family(tmp_path / "scale", extra, body=body)))
    assert str(error.value).startswith(f"{tmp_path / 'scale' / '__init__.py'}: {field}: ") and what in str(error.value)


def test_a_missing_reference_and_two_families_in_one_module_are_refused(tmp_path):
    with pytest.raises(FamilyError, match="reference: missing"):
        SimpleFamily("k.cu.j2", reference=None, shape="N", params={"A": (1,)}, inputs={"x": "N"},
                     outputs={"y": "N"}, args="y, x", grid=1, block=1)
    two = DEFINITION + "\nother = scale\nfrom templates.simple import SimpleFamily\n" \
                       "copy = SimpleFamily('scale.cu.j2', reference=scale.reference_fn, shape='N', " \
                       "params={'A': (1,)}, inputs={'x': 'N'}, outputs={'y': 'N'}, args='y, x', grid=1, block=1)\n"
    with pytest.raises(TemplateError, match="defines 2 kernel families"):
        get_family(str(write_family(tmp_path / "two", body=two)))


def test_a_plain_cuda_file_gets_the_configs_defines():
    source = "#ifndef TILE\n#define TILE 32\n#endif\n#define ROWS 8\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\nint t = TILE;\n"
    out = with_defines(source, {"TILE": 64, "ROWS": 4, "PAD": 1})
    assert out.startswith("#define PAD 1\n") and "#define TILE 64\n" in out and "#define ROWS 4\n" in out
    assert "#define MAX(a, b) ((a) > (b) ? (a) : (b))" in out and "32" not in out and "ROWS 8" not in out
    family = get_family(str(EXAMPLES / "transpose"))
    problem = family.parse_problem("1000001,7", "fp32")
    assert "#define TILE_DIM 16\n" in family.render(dict(TILE_DIM=16, BLOCK_ROWS=4, PAD=0), problem)
    assert family.launch(dict(TILE_DIM=16, BLOCK_ROWS=4, PAD=0), problem).grid == (1, 62501, 1)


def test_without_torch_the_data_is_refused_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    family = get_family(str(EXAMPLES / "row_softmax"))
    problem = family.parse_problem("4,64", "fp16")
    with pytest.raises(TemplateError, match=r"^the short family form needs torch here: pip install"):
        family.inputs(problem, 0)
    assert family.input_shapes(problem) == {"x": ((4, 64), "fp16")}  # shapes need no torch


@needs_torch
def test_inputs_are_random_never_zero_and_the_same_for_a_seed():
    family = get_family(str(EXAMPLES / "rmsnorm"))
    problem = family.parse_problem("3,40", "bf16")
    first, again, other = family.inputs(problem, 1), family.inputs(problem, 1), family.inputs(problem, 2)
    assert list(first) == ["x", "residual", "weight"] and first["weight"].shape == (40,)
    assert all(a.dtype == np.uint16 and np.count_nonzero(a) > 0.9 * a.size for a in first.values())
    assert all(np.array_equal(first[n], again[n]) for n in first)
    assert not np.array_equal(first["x"], other["x"])


def _right(family, problem, inputs):
    """The family's reference rounded to the outputs' types: what a right kernel writes."""
    import torch

    from templates import tensors

    expected = tensors.run_reference(family, problem, inputs, "cpu")
    return {name: tensors.to_host(values.to(getattr(torch, tensors.TORCH_DTYPES[family.buffer_dtype(name, problem)])))
            for name, values in expected.items()}


@needs_torch
@pytest.mark.parametrize("example, shape, dtype", [
    ("row_softmax", "37,1000", "fp16"), ("row_softmax", "5,4097", "bf16"), ("silu_mul", "9,4097", "fp16"),
    ("rmsnorm", "7,4097", "bf16"), ("rmsnorm", "300,64", "fp16"), ("transpose", "33,7", "fp32")])
def test_the_checks_accept_a_right_output_and_refuse_wrong_ones(example, shape, dtype):
    from templates.simple import ELEMENTS

    family = get_family(str(EXAMPLES / example))
    problem = family.parse_problem(shape, dtype)
    inputs = family.inputs(problem, seed=3)
    right = _right(family, problem, inputs)
    assert check_outputs(family, problem, inputs, right).ok
    for name in right:
        spec = next(s for s in family.outputs(problem) if s.name == name)
        hole = {**right, name: right[name].copy()}
        poison = ELEMENTS[spec.element][1]
        bits = hole[name].view(np.uint16 if hole[name].itemsize == 2 else np.uint32).reshape(-1)
        bits[-1] = poison if hole[name].itemsize == 2 else poison * 0x10001  # the last element unwritten
        assert "unwritten" in check_outputs(family, problem, inputs, hole).reason
        swapped = {**right, name: right[name].copy()}
        swapped[name][-1] = swapped[name][0]  # the last row is another row's
        reason = check_outputs(family, problem, inputs, swapped).reason
        assert reason and f"'{name}'" in reason


@needs_torch
def test_one_wrong_row_among_many_is_found():
    family = get_family(str(EXAMPLES / "rmsnorm"))
    problem = family.parse_problem("1000000,4", "fp16")
    inputs = family.inputs(problem, seed=0)
    right = _right(family, problem, inputs)
    wrong = {**right, "out": right["out"].copy()}
    wrong["out"][654321] = wrong["out"][4320]
    check = check_outputs(family, problem, inputs, wrong)
    assert check.error < 2e-3 and check.reason.startswith("row 654321 of 'out'")  # the whole hides it
