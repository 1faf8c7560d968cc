"""What of a family's kernel file makes its template version: a Python file's code without its
comments and docstrings (a reworded note is not a new version of the kernels, and the stored bests
stay current), any other file (the Jinja CUDA sources) byte for byte.

The text is cut from the file by the positions that ``ast`` and ``tokenize`` give, not rebuilt
from either: the same file gives the same text on every Python version (``ast.dump`` and f-string
tokens differ between 3.11 and 3.12, and a study stored on one machine is looked up on another).
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from pathlib import Path

Span = tuple[tuple[int, int], tuple[int, int]]  # (line, column) of the first and past the last character


def versioned_bytes(path: Path) -> bytes:
    """The part of ``path`` that the template version hashes."""
    data = path.read_bytes()
    if path.suffix != ".py":
        return data
    try:
        return code_only(data.decode()).encode()
    except (SyntaxError, tokenize.TokenError, UnicodeDecodeError):  # not Python we can read: every byte
        return data


@functools.lru_cache(maxsize=64)  # by the text: a template version is read often, its files rarely change
def code_only(source: str) -> str:
    """``source`` without comments, docstrings, blank lines and trailing spaces."""
    lines = source.splitlines()
    for (l0, c0), (l1, c1) in sorted(_comments(source) + _docstrings(source), reverse=True):
        first, last = lines[l0 - 1], lines[l1 - 1]
        lines[l0 - 1:l1] = [first[:c0] + last[c1:]]
    return "\n".join(line.rstrip() for line in lines if line.strip())


def _comments(source: str) -> list[Span]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(t.start, t.end) for t in tokens if t.type == tokenize.COMMENT]


def _docstrings(source: str) -> list[Span]:
    lines = source.splitlines()

    def column(line: int, byte: int) -> int:  # ast counts a line's UTF-8 bytes, tokenize its characters
        return len(lines[line - 1].encode()[:byte].decode())

    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                spans.append(((first.lineno, column(first.lineno, first.col_offset)),
                              (first.end_lineno, column(first.end_lineno, first.end_col_offset))))
    return spans
