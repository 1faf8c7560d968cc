"""The family contract's shared pieces: the template hash, output formats, host-side checks."""

from __future__ import annotations

import shutil
from types import SimpleNamespace
from pathlib import Path

import numpy as np
import pytest

from templates import get_family
from templates.family import BufferSpec, Flag, Problem, TemplateError, autotuned_peer, count_nonfinite

ATTENTION = get_family("attention")


def _copy_of_attention(tmp_path: Path, kernel_files):
    folder = tmp_path / "attention"
    shutil.copytree(ATTENTION.folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    family = type(ATTENTION).__new__(type(ATTENTION))  # same space, another folder
    family.folder, family.kernel_files = folder, kernel_files
    return family, folder


def test_the_hash_follows_the_kernel_files_only(tmp_path):
    family, folder = _copy_of_attention(tmp_path, ATTENTION.kernel_files)
    assert family.template_hash == ATTENTION.template_hash
    (folder / "problem.py").write_text((folder / "problem.py").read_text() + "\n# another tolerance\n")
    (folder / "starts.py").write_text((folder / "starts.py").read_text() + "\n")
    (folder / "__init__.py").write_text((folder / "__init__.py").read_text() + "\n")
    assert family.template_hash == ATTENTION.template_hash  # not kernel files
    (folder / "space.py").write_text((folder / "space.py").read_text() + "\nLIMIT = 1\n")
    assert family.template_hash != ATTENTION.template_hash


def test_a_python_kernel_files_comments_and_docstrings_are_not_its_version(tmp_path):
    family, folder = _copy_of_attention(tmp_path, ATTENTION.kernel_files)
    space = folder / "space.py"
    text = space.read_text()
    assert '"""' in text and "# " in text
    reworded = text.replace('"""', '"""Reworded. ', 1).replace("# ", "# reworded: ", 3)
    space.write_text(reworded + "\n\n# a note at the end\n")
    assert family.template_hash == ATTENTION.template_hash
    space.write_text(reworded + "\nLIMIT = 1\n")
    assert family.template_hash != ATTENTION.template_hash
    space.write_text(text)
    hopper = folder / "hopper.cu.j2"  # the CUDA template: byte for byte, its comments too
    hopper.write_text(hopper.read_text() + "// a note\n")
    assert family.template_hash != ATTENTION.template_hash


def test_without_kernel_files_every_file_counts(tmp_path):
    family, folder = _copy_of_attention(tmp_path, ())
    before = family.template_hash
    (folder / "problem.py").write_text((folder / "problem.py").read_text() + "\nTOLERANCE = 1\n")
    assert family.template_hash != before


def test_a_missing_kernel_file_is_an_error(tmp_path):
    family, _ = _copy_of_attention(tmp_path, ("kernel.cu.j2", "gone.py"))
    with pytest.raises(TemplateError, match="'gone.py'"):
        family.template_hash


@pytest.mark.parametrize("element, dtype, bad", [
    ("fp16", np.float16, [np.nan, np.inf, -np.inf]),
    ("fp32", np.float32, [np.nan, -np.inf]),
])
def test_count_nonfinite_counts_nan_inf_and_poison(element, dtype, bad):
    values = np.linspace(-65000, 65000, 1000).astype(dtype)
    values[[3, 500, 999][:len(bad)]] = bad
    raw = values.view(np.uint16 if element == "fp16" else np.uint32)
    assert count_nonfinite(raw, element) == len(bad)
    assert count_nonfinite(np.zeros_like(raw), element) == 0


def test_count_nonfinite_bf16():
    bits = np.array([0x3F80, 0x7F80, 0xFF80, 0x7FC0, 0x7F7F, 0x0001], dtype=np.uint16)  # 1, +-inf, nan, max, tiny
    assert count_nonfinite(bits, "bf16") == 3


def test_buffer_spec_element_is_checked():
    with pytest.raises(TemplateError, match="unknown element format 'fp8'"):
        BufferSpec("o", (4,), np.dtype(np.uint16), 0x7E00, element="fp8")
    with pytest.raises(TemplateError, match="fp32 elements are 4 bytes"):
        BufferSpec("o", (4,), np.dtype(np.uint16), 0x7E00, element="fp32")


def test_a_family_that_lives_elsewhere_is_found_by_module_and_name():
    assert get_family("templates.attention:FAMILY") is ATTENTION
    with pytest.raises(TemplateError, match="cannot load kernel family 'no_such_module:FAMILY'"):
        get_family("no_such_module:FAMILY")
    with pytest.raises(TemplateError, match="cannot load kernel family 'templates.attention:NOPE'"):
        get_family("templates.attention:NOPE")


def test_a_problem_carries_every_declared_flag_and_prints_them():
    plain = ATTENTION.parse_problem("2,8,1024,64", "fp16")
    assert plain.flags == (("causal", False),) and plain.key == "2x8x1024x64-fp16"
    masked = ATTENTION.parse_problem("2,8,1024,64", "fp16", {"causal": "true"})
    assert masked.flag("causal") is True and masked.key == "2x8x1024x64-fp16-causal"
    assert masked == ATTENTION.parse_problem([2, 8, 1024, 64], "fp16", {"causal": 1})
    assert masked.spec == {"shape": [2, 8, 1024, 64], "dtype": "fp16", "flags": {"causal": True}}
    assert ATTENTION.problem_from_spec(masked.spec) == masked
    # files written before flags name causal beside shape and dtype
    assert Problem.from_json({"shape": [2, 8, 1024, 64], "dtype": "fp16", "causal": True}) == masked
    with pytest.raises(KeyError):
        masked.flag("layout")


@pytest.mark.parametrize("flags, message", [
    ({"masked": True}, "unknown problem flag 'masked' (flags: causal)"),
    ({"causal": "sometimes"}, "flag causal='sometimes' is not one of [False, True]"),
    ({"causal": 2}, "flag causal=2 is not one of"),
])
def test_flags_a_family_does_not_declare_are_refused(flags, message):
    with pytest.raises(TemplateError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        ATTENTION.parse_problem("2,8,1024,64", "fp16", flags)


def test_choice_flags_print_as_name_and_value():
    class Layouts(type(ATTENTION)):
        flags = (Flag("layout", ("nn", "nt", "tn"), "A and B transposed or not"), Flag("bias", doc="add a bias"))

    family = Layouts()
    problem = family.parse_problem("2,8,1024,64", "fp16", {"layout": "tn"})
    assert problem.flags == (("bias", False), ("layout", "tn")) and problem.key == "2x8x1024x64-fp16-layout=tn"
    assert family.parse_problem("2,8,1024,64", "fp16", {"bias": "yes"}).key == "2x8x1024x64-fp16-bias-layout=nn"
    with pytest.raises(TemplateError, match="flag layout='tt' is not one of"):
        family.parse_problem("2,8,1024,64", "fp16", {"layout": "tt"})


def test_the_default_distance_keeps_dtype_flags_and_last_dimension():
    near = ATTENTION.parse_problem("2,8,1024,64", "fp16")
    assert ATTENTION.distance(ATTENTION.parse_problem("2,8,4096,64", "fp16"), near) == 2.0
    assert ATTENTION.distance(ATTENTION.parse_problem("8,8,1024,64", "fp16"), near) == 2.0
    for other in (ATTENTION.parse_problem("2,8,1024,128", "fp16"), ATTENTION.parse_problem("2,8,1024,64", "bf16"),
                  ATTENTION.parse_problem("2,8,1024,64", "fp16", {"causal": True})):
        assert ATTENTION.distance(other, near) == float("inf")


@pytest.mark.parametrize("change, message", [
    (lambda p: dict(p, BLOCK_Q=100), "gemm: unknown parameter 'BLOCK_Q'"),
    (lambda p: dict(p, STAGES=5), "gemm: STAGES=5 is not one of [3, 2, 4, 6, 8, 12, 16]"),
    (lambda p: {k: v for k, v in p.items() if k not in ("GROUP_M", "SWAP_AB")},
     "gemm: missing parameters ['GROUP_M', 'SWAP_AB']"),
])
def test_a_config_outside_the_space_is_refused_by_name(change, message):
    family = get_family("gemm")
    family.validate_params(family.default_params())
    with pytest.raises(TemplateError) as caught:
        family.validate_params(change(family.default_params()))
    assert str(caught.value) == message


def test_an_autotuned_peer_says_what_it_chose_or_why_it_cannot_run():
    run = lambda: "out"  # noqa: E731
    tuned = autotuned_peer(True, lambda: SimpleNamespace(config="BLOCK_M=64 stages=3", seconds=1.5), run,
                           "block FP8, ")
    assert (tuned.run, tuned.note, tuned.tune_seconds) == (run, "block FP8, autotuned to BLOCK_M=64 stages=3", 1.5)

    def never():
        raise AssertionError("tuned without Triton")

    missing = autotuned_peer(False, never, run)
    assert (missing.run, missing.note, missing.tune_seconds) == (None, "Triton is not installed", None)
