"""Databases of tuned problems for the deploy tests (tests/tuner/test_tuner_dispatch.py,
tests/workers/test_worker_loader.py, tests/gpu/test_deploy_gpu.py), made without a GPU:
attention's from the replay landscapes recorded on an H200 (tests/data and the family's own),
gemm's from configs chosen to exercise the rule (a nearer winner whose tile is too wide for the
new shape)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Sequence

from storage import TrialOutcome, open_repository
from templates import get_family
from templates.attention import starts
from templates.family import DeviceLimits

ROOT = Path(__file__).resolve().parents[1]
H200 = {"name": "NVIDIA H200", "sm_count": 132, "compute_capability": [9, 0],
        "max_smem_per_block_optin": 232448, "driver_version": "580.159.04", "cuda_version": "13.0"}
H200_LIMITS = DeviceLimits("NVIDIA H200", (9, 0), 132, 232448)


def store(db: str, family_name: str, shape: Sequence[int], dtype: str, flags: dict[str, Any],
          trials: Sequence[tuple[dict[str, Any], float]], device: dict[str, Any] = H200) -> str:
    """A finished study of the problem with these (params, median ms) trials, as tune stores one,
    under the family's current template version."""
    family = get_family(family_name)
    problem = family.parse_problem(shape, dtype, flags)
    name = f"{family.name}/{problem.key}/{device['name']}"
    with open_repository(db) as repo:
        record = repo.open_study(
            name, family=family.name, template_hash=family.template_hash,
            space={p.name: list(p.choices) for p in family.params}, shape=list(problem.shape),
            dtype=dtype, flags=dict(problem.flags), device=device, sampler="tpe", replay=True,
            settings={"device": device})
        for number, (params, median) in enumerate(trials):
            repo.record_trial(record.id, number, params, TrialOutcome("ok", median_ms=median, tflops=1.0))
        repo.set_study_status(record.id, "finished")
    return name


def landscapes() -> list[Path]:
    return sorted((ROOT / "tests" / "data").glob("attention_*.json")) + \
        sorted((ROOT / "templates" / "attention" / "landscapes").glob("attention_*.json"))


def attention_db(db: str, fastest: int = 3) -> list[str]:
    """Each landscape's ``fastest`` valid configs (under the current space and constraints) stored
    as a study of its problem; returns the problems' keys."""
    family = get_family("attention")
    keys = []
    for path in landscapes():
        data = json.loads(path.read_text())
        problem = family.problem_from_spec(data["problem"])
        measured = []
        for entry in data["entries"]:
            timing = (entry["measurement"] or {}).get("timing")
            if not entry["measurement"].get("ok") or not timing:
                continue
            params = family.complete(entry["params"])
            try:
                if family.check(params, problem, H200_LIMITS) is None:
                    measured.append((params, timing["median_ms"]))
            except ValueError:
                continue
        measured.sort(key=lambda item: item[1])
        store(db, "attention", problem.shape, problem.dtype, dict(problem.flags), measured[:fastest])
        keys.append(problem.key)
    # The landscapes' winners are all cp.async kernels: two problems of kinds they lack won by
    # the family's TMA starting points (persistent, longest tiles first; persistent with the TMA
    # store), with made-up times, for the TMA launch (tensor maps, tile counter, capped grid).
    for shape, dtype, flags, params in TMA_WINNERS:
        problem = family.parse_problem(shape, dtype, flags)
        full = family.complete(params)
        assert family.check(full, problem, H200_LIMITS) is None
        store(db, "attention", shape, dtype, flags, [(full, 0.2)])
        keys.append(problem.key)
    return keys


TMA_WINNERS = [
    ((2, 16, 2048, 128), "bf16", {"causal": True}, starts.TMA_POINTS[128][2]),
    ((2, 8, 2048, 64), "fp16", {"causal": False}, starts.TMA_POINTS[64][0]),
    ((1, 32, 2048, 128, 8), "bf16", {"causal": True}, starts.TMA_POINTS[128][2]),  # grouped-query
]


GEMM = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "NUM_WARPS": 8, "STAGES": 3, "SMEM_LAYOUT": "swizzle",
        "GROUP_M": 8, "MMA": "sync", "PRODUCER_REGS": 0, "PERSISTENT": 0, "SPLIT_K": 1,
        "CLUSTER_M": 1, "C_STORE": "direct", "SWAP_AB": 0, "PINGPONG": 0}


def gemm_db(db: str) -> dict[str, dict[str, Any]]:
    """Three bf16 "nt" problems: 128x4096x4096 won by the wgmma path's 128x256 tile with K in two
    parts and C stored by TMA (tensor maps, C's too, and split-K's workspace in its launch; refused where A's or B's rows are
    unaligned, or where M and N make more work units than the workspace holds), 16x4096x4096 by the wgmma
    path with A's 16 rows as the MMA's N (SWAP_AB: refused past M = 256), 1024x1024x1024 by a 128x64 tile
    with 4 stages; one fp16 "nn" + bias_relu problem; and one bf16 "nt" + bias_gelu_tanh problem won by
    the wgmma path's 128x256 tile, C stored by TMA.
    Returns each key's winner."""
    family = get_family("gemm")
    wins = [
        ((128, 4096, 4096), "bf16", {"layout": "nt"}, dict(GEMM, BLOCK_N=256, BLOCK_K=64, STAGES=4, MMA="wgmma",
                                                           PRODUCER_REGS=40, SPLIT_K=2, C_STORE="tma")),
        ((16, 4096, 4096), "bf16", {"layout": "nt"}, dict(GEMM, BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, NUM_WARPS=4,
                                                          STAGES=12, MMA="wgmma", SWAP_AB=1)),
        ((1024, 1024, 1024), "bf16", {"layout": "nt"}, dict(GEMM, BLOCK_N=64, STAGES=4, GROUP_M=4)),
        ((512, 512, 512), "fp16", {"layout": "nn", "epilogue": "bias_relu"}, dict(GEMM, BLOCK_K=64, STAGES=2)),
        ((256, 1024, 1024), "bf16", {"layout": "nt", "epilogue": "bias_gelu_tanh"},
         dict(GEMM, BLOCK_N=256, BLOCK_K=64, STAGES=4, MMA="wgmma", PRODUCER_REGS=40, C_STORE="tma")),
    ]
    found = {}
    for shape, dtype, flags, params in wins:
        problem = family.parse_problem(shape, dtype, flags)
        assert family.check(params, problem, H200_LIMITS) is None, (problem.key, family.check(params, problem, H200_LIMITS))
        store(db, "gemm", shape, dtype, flags, [(params, 0.05), (dict(params, GROUP_M=1), 0.06)])
        found[problem.key] = params
    return found


PROGRAM = ROOT / "tests" / "dispatch" / "check_dispatch.cu"


def compile_program(family: str, out: Path) -> Path:
    """The dispatch header's test program for ``family``, built by nvcc against ``out``'s header."""
    program = out / f"check_{family}"
    done = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", f"-DFAMILY_{family.upper()}", "-I", str(out),
                           "-o", str(program), str(PROGRAM), "-ldl"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"nvcc failed on the {family} dispatch program:\n{done.stderr[-3000:]}"
    return program


def nvrtc_env() -> dict[str, str]:
    """The environment for the test program: TUNED_NVRTC naming the NVRTC library the tuner's
    wheel (nvidia-cuda-nvrtc) installed, else the toolkit's beside nvcc, and its folder (its
    builtins) on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    try:
        import nvidia

        found = sorted((Path(p) for base in nvidia.__path__ for p in Path(base).glob("cu*/lib/libnvrtc.so.*")
                        if re.fullmatch(r"libnvrtc\.so\.\d+", Path(p).name)),
                       key=lambda path: int(path.name.rsplit(".", 1)[1]))  # the newest release last
    except ImportError:
        found = []
    nvcc = shutil.which("nvcc")
    if not found and nvcc:  # the toolkit's, beside nvcc
        root = Path(os.path.realpath(nvcc)).parent.parent
        found = sorted(p for lib in ("lib64", "targets/x86_64-linux/lib") for p in (root / lib).glob("libnvrtc.so")
                       if p.exists())
    if found and "TUNED_NVRTC" not in env:
        env["TUNED_NVRTC"] = str(found[-1])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(found[-1].parent), env.get("LD_LIBRARY_PATH")]))
    return env
