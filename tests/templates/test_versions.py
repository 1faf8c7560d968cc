"""A Python kernel file's version text: its code, without comments and docstrings."""

from __future__ import annotations

from templates.versions import code_only, versioned_bytes

SOURCE = '''"""The module's docstring,
over two lines: 6³ is 216."""
import math  # a comment after code

LIMIT = 96  # registers


class Rule:
    """A class's docstring."""

    def fits(self, n: int) -> bool:
        """A method's docstring ending in ü."""  # and a comment beside it
        label = f"{n} # not a comment"
        note = "# nor this"
        return n <= LIMIT and label != note


def plain(x):
    return math.sqrt(x)
'''


def test_comments_docstrings_and_blank_lines_go_and_the_code_stays():
    assert code_only(SOURCE).splitlines() == [
        "import math",
        "LIMIT = 96",
        "class Rule:",
        "    def fits(self, n: int) -> bool:",
        '        label = f"{n} # not a comment"',
        '        note = "# nor this"',
        "        return n <= LIMIT and label != note",
        "def plain(x):",
        "    return math.sqrt(x)",
    ]


def test_a_reworded_note_keeps_the_text_and_a_changed_value_does_not():
    reworded = (SOURCE.replace("A class's docstring.", "Reworded, longer: 8³.")
                .replace("# registers", "# registers a thread\n# and another line"))
    assert code_only(reworded) == code_only(SOURCE)
    assert code_only(SOURCE.replace("LIMIT = 96", "LIMIT = 72")) != code_only(SOURCE)
    assert code_only(SOURCE.replace('"# nor this"', '"# nor that"')) != code_only(SOURCE)


def test_a_string_that_is_not_a_docstring_stays():
    source = 'def f():\n    x = 1\n    "not the first statement"\n    return x\n'
    assert '"not the first statement"' in code_only(source)


def test_other_files_count_byte_for_byte(tmp_path):
    cuda = tmp_path / "k.cu.j2"
    cuda.write_text("// a note\n#define N 4\n")
    assert versioned_bytes(cuda) == b"// a note\n#define N 4\n"
    py = tmp_path / "k.py"
    py.write_text("N = 4  # a note\n")
    assert versioned_bytes(py) == b"N = 4"
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n    pass  # a note\n")
    assert versioned_bytes(broken) == b"def f(:\n    pass  # a note\n"
