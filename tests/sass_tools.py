"""Reading compiled kernels' machine code in tests: cuobjdump's SASS of a source, and its opcodes.

Needs nvcc and cuobjdump with nvdisasm (the test extra installs NVIDIA's wheels of the latter two);
``needs_sass`` skips a test module where one is missing.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from workers.compile import compile_cubin
from workers.results import CompileRequest


def _tool(name: str) -> str | None:
    """A CUDA binary on PATH, else from NVIDIA's wheel of it (``site-packages/nvidia/cu*/bin``)."""
    found = shutil.which(name)
    if found is not None:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    return next((str(p) for root in nvidia.__path__ for p in sorted(Path(root).glob(f"cu*/bin/{name}"))), None)


CUOBJDUMP, NVDISASM = _tool("cuobjdump"), _tool("nvdisasm")
needs_sass = pytest.mark.skipif(
    shutil.which("nvcc") is None or CUOBJDUMP is None or NVDISASM is None,
    reason="needs nvcc and cuobjdump/nvdisasm",
)
_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)")


def sass_of(request: CompileRequest, tmp_path: Path) -> str:
    """The SASS of ``request``'s kernel (compiled into ``tmp_path``)."""
    return _disassemble(compile_cubin(request, cache_dir=tmp_path).cubin, tmp_path)


def sass_of_each(requests: list[CompileRequest], tmp_path: Path) -> list[str]:
    """The SASS of each request's kernel, in order, compiled into ``tmp_path`` on the session's
    pool (``tests/cores.py``)."""
    import cores

    return [_disassemble(binary.cubin, tmp_path) for binary in cores.compile_each(requests, tmp_path)]


def _disassemble(cubin_bytes: bytes, tmp_path: Path) -> str:
    """cuobjdump's SASS of a cubin (written to ``tmp_path``)."""
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(cubin_bytes)
    env = {**os.environ, "PATH": f"{Path(NVDISASM).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([CUOBJDUMP, "-sass", str(cubin)], capture_output=True, text=True, check=True,
                          env=env).stdout


def opcode_counts(sass: str) -> collections.Counter:
    """Opcode counts of SASS text, each under its base name and its full name."""
    counts: collections.Counter = collections.Counter()
    for match in _OPCODE.finditer(sass):
        counts[match.group(1)] += 1
        counts[match.group(1) + match.group(2)] += 1
    return counts
