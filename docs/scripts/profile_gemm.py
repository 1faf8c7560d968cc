"""One config of ours and cuBLAS's on the same GEMM problem, for Nsight Compute to profile.

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats -k regex:^gemm$ --launch-skip 20 -c 1 \
        python3 docs/scripts/profile_gemm.py 4096,4096,4096 fp16 nn PARAMS_JSON
    ncu ... -k regex:sm90 -c 1 python3 docs/scripts/profile_gemm.py ... --cublas-only PARAMS_JSON

Ours runs through the workers' trial (outputs checked against the float64 reference first),
cuBLAS through torch.matmul on inputs of the same shape.
"""

from __future__ import annotations

import json
import sys

from templates import get_family
from workers.local import LocalBench

FAMILY = get_family("gemm")


def main(shape: str, dtype: str, layout: str, params: dict) -> None:
    import torch

    problem = FAMILY.parse_problem(shape, dtype, {"layout": layout})
    params = dict(FAMILY.default_params(), **params)
    if "--cublas-only" not in sys.argv:
        with LocalBench() as local:
            m = local.measure("gemm", problem, FAMILY.render(params, problem), FAMILY.launch(params, problem),
                              FAMILY.compile_options(params, problem))
            print(f"ours: {m.ok} {m.timing.median_ms * 1e3 if m.ok else m.reason} us", flush=True)
    m, n, k = problem.shape
    torch_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    a = torch.randn(m, k, device="cuda", dtype=torch_dtype)
    b = torch.randn(k, n, device="cuda", dtype=torch_dtype)
    for _ in range(3):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    print("cublas: ran", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[-1]))
