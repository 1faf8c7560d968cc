"""One launch of ours and one of cuDNN's on the same D=64 problem, for Nsight Compute to profile.

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
        --section ComputeWorkloadAnalysis -k regex:attention_fwd -c 1 \
        python3 docs/scripts/profile_d64.py "16,16,2048,64" fp16 [--causal] PARAMS_JSON
    ncu ... --launch-skip 3 -c 1 python3 docs/scripts/profile_d64.py ... --cudnn-only PARAMS_JSON
        (the three kernels before cuDNN's draw Q, K and V)

Ours runs through the workers' trial (outputs checked against the float64 reference first),
cuDNN through torch SDPA on the same inputs.
"""

from __future__ import annotations

import json
import sys

from templates import get_family
from workers.local import LocalBench

FAMILY = get_family("attention")


def main(shape: str, dtype: str, causal: bool, params: dict) -> None:
    import torch

    problem = FAMILY.parse_problem(shape, dtype, {"causal": causal})
    params = dict(FAMILY.default_params(), **params)
    if "--cudnn-only" not in sys.argv:
        with LocalBench() as local:
            m = local.measure("attention", problem, FAMILY.render(params, problem), FAMILY.launch(params, problem),
                              FAMILY.compile_options(params, problem))
            print(f"ours: {m.ok} {m.timing.median_ms * 1e3 if m.ok else m.reason} us", flush=True)
    b, h, s, d = problem.shape
    torch_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch_dtype) for _ in range(3))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(2):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    print("cudnn: ran", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--causal" in sys.argv[3:], json.loads(sys.argv[-1]))
