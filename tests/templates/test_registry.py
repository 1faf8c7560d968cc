"""Where families come from: installed entry points, a path, module:ATTR, register(); each
refusal one line."""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import pytest

import templates
import templates.attention
from templates import TemplateError, families, get_family, reference, register, unregister

OUTSIDE = Path(__file__).resolve().parents[1] / "data" / "outside_family"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """The outside family copied off every import path."""
    return Path(shutil.copytree(OUTSIDE, tmp_path / "elsewhere" / "outside_family"))


def _refused(ref: str) -> str:
    with pytest.raises(TemplateError) as caught:
        get_family(ref)
    text = str(caught.value)
    assert "\n" not in text, text
    return text


def test_the_entry_points_declare_attention():
    points = {p.name: p.value for p in importlib.metadata.entry_points(group=templates.GROUP)}
    assert points["attention"] == "templates.attention:FAMILY"
    assert "attention" in families()
    family = get_family("attention")
    assert family is templates.attention.FAMILY
    assert reference(family) == "attention"
    assert get_family("templates.attention:FAMILY") is family


def test_a_folder_loads_by_path_with_its_relative_imports_and_templates(outside, monkeypatch):
    family = get_family(str(outside))
    assert family.name == "outside_scale" and family.folder == outside
    assert [p.name for p in family.params] == ["block", "unroll"]  # from .space
    problem = family.parse_problem("1000", "fp32")
    assert "blockIdx.x * 128" in family.render({"block": 128, "unroll": 1}, problem)  # kernel.cu.j2
    assert len(family.template_hash) == 16
    assert reference(family) == str(outside)  # what a worker resolves: the absolute path
    monkeypatch.chdir(outside.parent)
    assert get_family("./outside_family") is family  # the same module, loaded once
    assert family.name not in families()  # a path is no name


def test_a_py_file_loads_by_path(tmp_path):
    path = tmp_path / "one_file.py"
    path.write_text("from templates import get_family\nFAMILY = get_family('attention')\n")
    assert get_family(str(path)) is templates.attention.FAMILY


def test_two_folders_of_one_name_do_not_clash(outside, tmp_path):
    other = Path(shutil.copytree(OUTSIDE, tmp_path / "another" / "outside_family"))
    assert get_family(str(other)) is not get_family(str(outside))


def test_bad_paths_are_one_line(tmp_path):
    nowhere = tmp_path / "nowhere"
    assert _refused(str(nowhere)) == f"no kernel family at {nowhere}: no such file or folder"

    empty = tmp_path / "empty"
    empty.mkdir()
    assert "the folder has no __init__.py" in _refused(str(empty))

    nofamily = tmp_path / "nofamily.py"
    nofamily.write_text("X = 1\n")
    assert _refused(str(nofamily)) == f"{nofamily} is not a kernel family: it defines no FAMILY"

    notone = tmp_path / "notone.py"
    notone.write_text("FAMILY = {'name': 'x'}\n")
    assert _refused(str(notone)) == f"kernel family {notone} is a dict, not a KernelFamily"

    (tmp_path / "broken.py").write_text("import no_such_module_anywhere\n")
    text = _refused(str(tmp_path / "broken.py"))
    assert text.startswith(f"cannot load kernel family {tmp_path / 'broken.py'}: ModuleNotFoundError")

    (tmp_path / "notes.txt").write_text("")
    assert "not a folder or a .py file" in _refused(str(tmp_path / "notes.txt"))


def test_bad_names_and_modules_are_one_line():
    text = _refused("softmax")
    assert text.startswith("unknown kernel family 'softmax' (known: attention")
    assert "by path" in text and "module:ATTR" in text
    assert "No module named" in _refused("no_such_module:FAMILY")
    assert "NOPE" in _refused("templates.attention:NOPE")
    assert _refused("templates.attention:KERNEL_NAME") == (
        "kernel family 'templates.attention:KERNEL_NAME' is a str, not a KernelFamily")


def test_registered_families_are_listed_and_travel_as_themselves(outside):
    family = type(get_family(str(outside)))()
    family.name = "outside_registered"
    register(family)
    try:
        assert {"attention", "outside_registered"} <= set(families())
        assert get_family("outside_registered") is family
        assert reference(family) is family  # no reference finds it elsewhere: shipped by value
    finally:
        unregister("outside_registered")
    assert "outside_registered" not in families()
    with pytest.raises(TemplateError, match="is a str, not a KernelFamily"):
        register("attention")  # type: ignore[arg-type]


def test_a_family_resolves_to_itself():
    assert get_family(templates.attention.FAMILY) is templates.attention.FAMILY


def test_without_this_project_installed_the_error_says_so(monkeypatch):
    import templates.registry

    monkeypatch.setattr(templates.registry, "_entry_points", lambda: [])
    assert "(known: none installed: pip install -e . in this project)" in _refused("attention_not_loaded")
