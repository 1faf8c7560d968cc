"""One config of ours and cuBLAS's on the same GEMM problem, for Nsight Compute to profile.

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats -k regex:^gemm$ --launch-skip 20 -c 1 \
        python3 docs/scripts/profile_gemm.py 4096,4096,4096 fp16 nn PARAMS_JSON
    ncu ... -k regex:sm90 -c 1 python3 docs/scripts/profile_gemm.py ... --cublas-only PARAMS_JSON

Ours runs through the workers' trial (outputs checked against the float64 reference first),
cuBLAS on the family's inputs through ``gemm_timing.peer``. The layout may name an epilogue after
a colon, ``nt:bias_gelu_tanh``: ours then runs it, and cuBLAS its fused form (cuBLASLt's, through
``torch._addmm_activation``); the type e4m3's scales (``e4m3:block``): the family's peer for them
runs instead of cuBLAS.
"""

from __future__ import annotations

import json
import sys

from gemm_timing import FAMILY, parse, peer
from workers.local import LocalBench


def main(shape: str, dtype: str, layout: str, params: dict) -> None:
    import torch

    problem = parse(shape, dtype, layout)
    params = dict(FAMILY.default_params(), **params)
    if "--cublas-only" not in sys.argv:
        with LocalBench() as local:
            m = local.measure("gemm", problem, FAMILY.render(params, problem), FAMILY.launch(params, problem),
                              FAMILY.compile_options(params, problem))
            print(f"ours: {m.ok} {m.timing.median_ms * 1e3 if m.ok else m.reason} us", flush=True)
    cublas = peer(problem)
    for _ in range(3):
        cublas()
    torch.cuda.synchronize()
    print("cublas: ran", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[-1]))
