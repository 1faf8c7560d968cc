"""Kernels that ptxas compiles only by cutting their wgmma pipeline, for the tests of its notes
(``workers.compile.ptxas_advisories``)."""

from __future__ import annotations

# The body: one wgmma whose accumulators are read before its wait; ptxas injects the wait (C7517).
_EARLY_READ_BODY = r"""
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    const unsigned long long da = (unsigned long long)x, db = da + 64;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(da), "l"(db));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    y[threadIdx.x] = d[0] + d[1];
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    y[threadIdx.x + 128] = d[2] + d[3];
}
"""


def early_read_kernel(signature: str) -> str:
    """A kernel that reads a wgmma's accumulators before its wait (for sm_90a; never run):
    ``signature``, its declaration up to the body's brace, takes ``float* y`` and ``const float* x``."""
    return signature + " {" + _EARLY_READ_BODY
