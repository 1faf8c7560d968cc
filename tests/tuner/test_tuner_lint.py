"""`tuner lint`: the four example families pass it without a GPU (their spaces counted, every
valid config rendered, a sample compiled for sm_90a without spills, the reference run on the
CPU), a broken family fails it in one line naming the file and the field, and the short
examples stay short."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from ptxas_kernels import early_read_kernel
from tuner.cli.commands import main
from tuner.reports.lint import LintError, lint_family, spread
from workers.compile import ptxas_advisories

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def python_lines(path: Path) -> int:
    """Lines of Python that are not blank or comments."""
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))


@pytest.mark.parametrize("example, limit", [("row_softmax", 30), ("silu_mul", 20)])
def test_the_short_examples_are_short(example, limit):
    assert python_lines(EXAMPLES / example / "__init__.py") <= limit


@pytest.mark.parametrize("example, valid, total", [
    ("row_softmax", 80, 80), ("silu_mul", 48, 48), ("rmsnorm", 572, 640), ("transpose", 26, 30)])
def test_each_example_passes(example, valid, total):
    report = lint_family(str(EXAMPLES / example), sample=2)
    first = report.spaces[0]
    assert (first.valid, first.total) == (valid, total) and report.rendered == valid
    assert sum(first.reasons.values()) == total - valid
    assert len(report.compiled) == 2 and report.toolkit.split()[0] in ("nvcc", "nvrtc")
    assert all(c.registers and c.spill_bytes == 0 and c.screened is None and not c.advisories
               for c in report.compiled)
    if HAS_TORCH:
        assert "passes its own check" in report.reference and "64x" in report.reference
    else:
        assert report.reference.startswith("not run: the short family form needs torch")


def test_odd_problems_are_counted_by_the_family():
    report = lint_family(str(EXAMPLES / "rmsnorm"), shape="1,4097", dtype="bf16", sample=1)
    assert report.problem.key == "1x4097-bf16" and report.spaces[0].valid == 158
    assert set(report.spaces[0].reasons) == {"divisibility", "registers"}  # VEC 1 only, as 4097 is odd
    assert len([s for s in report.spaces if s.problem.key == "1x4097-bf16"]) == 1


def test_a_full_family_is_linted_too():
    report = lint_family("attention", shape="1,8,1024,64", dtype="fp16", sample=1)
    assert report.spaces[0].valid > 100 and report.compiled[0].registers
    assert report.reference.startswith("not run: a KernelFamily subclass")


def test_a_family_storing_its_output_by_tma_passes():
    """gemm's C_STORE=tma passes C as a tensor map, not a buffer: an output all the same."""
    report = lint_family("gemm", shape="1024,1024,1024", dtype="bf16", sample=1)
    assert report.spaces[0].valid > 100 and report.compiled


def test_spread_takes_the_first_and_the_last():
    configs = [{"A": i} for i in range(10)]
    assert spread(configs, 3) == [{"A": 0}, {"A": 4}, {"A": 9}] and spread(configs[:2], 3) == configs[:2]


SOURCE = 'extern "C" __global__ void fam(float* y, const float* x, int n) { int i = {{ THREADS }}; }\n'
DEFINITION = """from templates.simple import kernel_family
@kernel_family('k.cu.j2', shape='N', dtypes=('fp32',), params=dict(THREADS=(128,)), inputs=dict(x='N'),
               outputs=dict(y='N'), args='y, x, N', grid=lambda p, s: 1, block=lambda p, s: p.THREADS,
               suite=[('100', 'fp32')])
def fam(x):
    return x
"""
# fault: (the template, the definition, what the line says after the folder)
BROKEN = {
    "template": (SOURCE.replace("{{ THREADS }}", "{{ THREADS }"), DEFINITION, "k.cu.j2: template"),
    "constraints": (SOURCE, DEFINITION.replace("suite=", "constraints=lambda p, s, d: p.NOPE, suite="),
                    "__init__.py: constraints: AttributeError"),
    "choices": (SOURCE, DEFINITION.replace("THREADS=(128,)", "THREADS=()"),
                "__init__.py: params: 'THREADS' has no choices"),
    "output": (SOURCE, DEFINITION.replace("outputs=dict(y='N')", "outputs=dict(y='N', z='N')"),
               "__init__.py: args: output 'z' is not among the kernel's arguments"),
    "compile": (SOURCE.replace("int i =", "nonsense("), DEFINITION,
                "__init__.py: template: {'THREADS': 128} does not compile"),
    "reference": (SOURCE, DEFINITION.replace("return x", "return None"),
                  "__init__.py: reference: returned NoneType for output 'y', not a tensor"),
}


@pytest.mark.parametrize("fault", list(BROKEN))
def test_a_broken_family_is_one_line_naming_the_file_and_the_field(tmp_path, capsys, fault):
    if fault == "reference" and not HAS_TORCH:
        pytest.skip("the reference runs with torch")
    template, definition, expected = BROKEN[fault]
    folder = tmp_path / "fam"
    folder.mkdir()
    (folder / "k.cu.j2").write_text(template)
    (folder / "__init__.py").write_text(definition)
    code = main(["lint", str(folder), "--sample", "1"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if " lint: compiling" not in line]
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"tuner: error: {folder}/") and expected in err[0], err[0]


# A wgmma whose accumulators are read before its wait: ptxas injects the wait (C7517).
EARLY_READ = early_read_kernel('extern "C" __global__ void fam(float* y, const float* x, int n)')


def test_ptxas_notes_of_a_cut_wgmma_pipeline_are_reported(tmp_path, capsys):
    """A config whose wgmma registers are read before the wait compiles, and lint says what ptxas
    did about it (a silent loss otherwise: a serialized pipeline runs at a fraction of the rate)."""
    folder = tmp_path / "early"
    folder.mkdir()
    (folder / "k.cu.j2").write_text(EARLY_READ)
    (folder / "__init__.py").write_text(DEFINITION)
    report = lint_family(str(folder), sample=1)
    (compiled,) = report.compiled
    assert any(a.startswith("C7517: warpgroup.wait is injected") for a in compiled.advisories), compiled.advisories
    assert main(["lint", str(folder), "--sample", "1"]) == 0
    assert "ptxas C7517: warpgroup.wait is injected" in capsys.readouterr().out


def test_ptxas_advisories_are_read_once_each_from_the_log():
    log = ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are  serialized\n"
           "ptxas info    : Used 168 registers\n"
           "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized\n"
           "ptxas info    : (C7517) warpgroup.wait is injected in around line 9\n")
    assert ptxas_advisories(log) == ("C7514: Potential Performance Loss: wgmma.mma_async instructions are serialized",
                                     "C7517: warpgroup.wait is injected in around line 9")
    assert ptxas_advisories("ptxas info    : Used 32 registers, 0 bytes spill stores") == ()


def test_no_suite_needs_a_problem(tmp_path):
    folder = tmp_path / "nosuite"
    folder.mkdir()
    (folder / "k.cu.j2").write_text(SOURCE)
    (folder / "__init__.py").write_text(DEFINITION.replace("suite=[('100', 'fp32')]", "suite=[]"))
    with pytest.raises(LintError, match=r"suite: empty: give a problem with --shape and --dtype"):
        lint_family(str(folder))
    assert lint_family(str(folder), shape="100", dtype="fp32", sample=0).spaces[0].valid == 1


def test_the_command_prints_the_report(capsys):
    assert main(["lint", str(EXAMPLES / "silu_mul"), "--sample", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"4096x11008-bf16 +48 of 48 valid \(100%\)", out) and "1x4097-fp16" in out
    assert "compiled for sm_90a" in out and out.rstrip().splitlines()[-1].startswith("reference: ")
