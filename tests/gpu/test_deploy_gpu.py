"""Deployable exports on a real GPU: `tuner export`'s kernels run by workers.loader on torch
tensors against the family's peer (torch SDPA, torch.matmul) and a float64 reference, and the
C++ dispatch header's test program (tests/dispatch/check_dispatch.cu) on shapes in and out of
its table against its float64 reference.

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_deploy_gpu.py``. Skipped without a GPU.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import tuner
from deploy_tables import GEMM, TMA_WINNERS, attention_db, compile_program, gemm_db, nvrtc_env, store
from templates import get_family
from templates.attention import starts
from templates.attention.problem import TOLERANCE as ATTENTION_TOLERANCE
from templates.gemm.problem import TOLERANCE as GEMM_TOLERANCE
from workers.loader import KernelArgumentError, load

pytestmark = pytest.mark.gpu

FA2 = starts.COMMON[3]  # FA2's 128 x 64 tile on mma.sync, cp.async
ATTENTION_CASES = [  # (shape, dtype, causal, params): cp.async; TMA persistent (longest tiles first);
    # TMA persistent with the TMA store
    ((2, 4, 777, 64), "fp16", False, FA2),
    ((2, 4, 1000, 128), "bf16", True, TMA_WINNERS[0][3]),
    ((1, 8, 1500, 64), "fp16", False, TMA_WINNERS[1][3]),
]


def _exported(tmp_path: Path, family: str, shape, dtype, flags, params):
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    store(db, family, shape, dtype, flags, [(get_family(family).complete(params), 0.1)])
    return load(tuner.export(family, shape, dtype, flags, out_dir=tmp_path / "out", db=db),
                cache_dir=tmp_path / "cubins")


def _relative(got, ref) -> float:
    return float((got.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("shape,dtype,causal,params", ATTENTION_CASES)
def test_an_exported_attention_kernel_runs_on_torch_tensors_as_sdpa_does(tmp_path, shape, dtype, causal, params):
    import torch
    import torch.nn.functional as F

    kernel = _exported(tmp_path, "attention", shape, dtype, {"causal": causal}, params)
    kind = torch.float16 if dtype == "fp16" else torch.bfloat16
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, dtype=kind, device="cuda", generator=generator) for _ in range(3))
    out = torch.full(shape, float("nan"), dtype=kind, device="cuda")  # poisoned
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # the loader launches on torch's current stream
        assert kernel(q, k, v, out) is out
    stream.synchronize()
    assert not out.isnan().any() and not out.isinf().any()
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(shape[3])
    if causal:
        scores = scores.masked_fill(torch.ones(shape[2], shape[2], device="cuda").triu(1).bool(), -math.inf)
    reference = scores.softmax(-1) @ v.double()
    assert _relative(out, reference) <= ATTENTION_TOLERANCE[dtype]
    peer = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert _relative(out, peer.double()) <= 2 * ATTENTION_TOLERANCE[dtype]
    again = kernel(q, k, v)  # the output allocated; a persistent kernel's counter left at zero
    torch.cuda.synchronize()
    assert torch.equal(again, out)


def test_the_loader_refuses_tensors_of_the_wrong_device_or_layout(tmp_path):
    import torch

    shape, dtype, flags, params = (2, 4, 777, 64), "fp16", {"causal": False}, FA2
    kernel = _exported(tmp_path, "attention", shape, dtype, flags, params)
    q = torch.randn(shape, dtype=torch.float16, device="cuda")
    with pytest.raises(KernelArgumentError, match="got float16 \\[2, 4, 777, 64\\] on cpu"):
        kernel(q, q, q.cpu())
    strided = torch.randn(2, 4, 64, 777, dtype=torch.float16, device="cuda").transpose(-1, -2)
    with pytest.raises(KernelArgumentError, match="v must be a contiguous fp16 CUDA tensor .* non-contiguous"):
        kernel(q, q, strided)


def test_an_exported_gemm_kernel_runs_on_torch_tensors_as_matmul_does(tmp_path):
    import torch

    shape, flags = (333, 255, 129), {"layout": "nt", "epilogue": "bias_relu"}
    kernel = _exported(tmp_path, "gemm", shape, "fp16", flags, GEMM)
    m, n, k = shape
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, dtype=torch.float16, device="cuda", generator=generator)
    b = torch.randn(n, k, dtype=torch.float16, device="cuda", generator=generator)  # "t": stored N x K
    bias = torch.randn(n, dtype=torch.float16, device="cuda", generator=generator) * math.sqrt(k)
    c = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    kernel(a=a, b=b, bias=bias, c=c)
    torch.cuda.synchronize()
    assert not c.isnan().any() and not c.isinf().any()
    reference = torch.relu(a.double() @ b.double().T + bias.double())
    limit = GEMM_TOLERANCE["fp16"] * max(1.0, math.sqrt(k / 4096))
    assert _relative(c, reference) <= limit
    peer = torch.relu(torch.matmul(a, b.T) + bias)
    assert _relative(c, peer.double()) <= 2 * limit


RUNS = {
    "attention": [((4, 8, 512, 64), "fp16", {"causal": "true"}, True),  # tuned
                  ((3, 8, 700, 64), "fp16", {"causal": "true"}, False),  # cp.async
                  ((1, 16, 3000, 128), "bf16", {"causal": "true"}, False),  # TMA, persistent, longest first
                  ((3, 8, 777, 64), "fp16", {"causal": "false"}, False)],  # TMA, persistent, TMA store
    "gemm": [((128, 4096, 4096), "bf16", {"layout": "nt"}, True),
             ((48, 1024, 4096), "bf16", {"layout": "nt"}, False),  # the nearer winner passed over
             ((100, 1024, 4095), "bf16", {"layout": "nt"}, False),  # operands unaligned
             ((500, 501, 500), "fp16", {"layout": "nn", "epilogue": "bias_relu"}, False),
             ((256, 1024, 1024), "bf16", {"layout": "nt", "epilogue": "bias_gelu_tanh"}, True),
             ((300, 1024, 1000), "bf16", {"layout": "nt", "epilogue": "bias_gelu_tanh"}, False)],
}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_the_dispatch_header_runs_shapes_in_and_out_of_its_table(tmp_path):
    built = {}
    for family, make in (("attention", attention_db), ("gemm", gemm_db)):
        db = f"sqlite:///{tmp_path / family}.db"
        make(db)
        built[family] = tuner.export_dispatch(family, out_dir=tmp_path / family, db=db).parent
    with ThreadPoolExecutor(2) as pool:
        programs = dict(zip(built, pool.map(lambda f: compile_program(f, built[f]), built)))
    for family, runs in RUNS.items():
        for shape, dtype, flags, measured in runs:
            argv = [str(programs[family]), "run", ",".join(map(str, shape)), dtype]
            argv += [f"{name}={value}" for name, value in flags.items()]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=nvrtc_env())
            got = json.loads(done.stdout)
            assert done.returncode == 0 and got["ok"], (argv, got, done.stderr)
            assert got["measured"] is measured and got["nonfinite"] == 0
            assert got["error"] <= got["tolerance"]
