"""The family contract's shared pieces: the template hash, output formats, host-side checks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from templates import get_family
from templates.family import BufferSpec, TemplateError, count_nonfinite

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
    (folder / "space.py").write_text((folder / "space.py").read_text() + "\n")
    assert family.template_hash != ATTENTION.template_hash


def test_without_kernel_files_every_file_counts(tmp_path):
    family, folder = _copy_of_attention(tmp_path, ())
    before = family.template_hash
    (folder / "problem.py").write_text((folder / "problem.py").read_text() + "\n")
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
