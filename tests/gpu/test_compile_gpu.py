"""NVRTC on the GPU machine: its own compile cache (~/.nv/ComputeCache, NVRTC 12.9+) answered
repeated compiles there without running ptxas, so the log lost the registers and spills the
compile screen reads. Here because that NVRTC is the one that caches; it needs no GPU.

Run on the GPU machine: ``pytest -m gpu``.
"""

from __future__ import annotations

import pytest

from templates import get_family
from templates.family import H100_LIMITS
from workers.compile import compile_cubin, parse_ptxas
from workers.results import CompileRequest

pytestmark = pytest.mark.gpu


def test_every_nvrtc_compile_reports_registers_and_spills_even_a_repeat():
    family = get_family("attention")
    problem = family.parse_problem("2,8,1024,64", "fp16", {"causal": True})
    params = family.starting_points(problem, H100_LIMITS)[0]
    launch = family.launch(params, problem)
    request = CompileRequest(family.render(params, problem), launch.kernel,
                             tuple(family.compile_options(params, problem)))
    binaries = [compile_cubin(request, backend="nvrtc") for _ in range(3)]  # no cache of ours
    for binary in binaries:
        reported = parse_ptxas(binary.log, launch.kernel)
        assert reported is not None and reported == binary.resources, binary.log[:200]
    assert len({b.cubin_hash for b in binaries}) == 1
