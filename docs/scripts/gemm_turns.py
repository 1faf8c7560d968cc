"""Gemm configs of the wgmma path timed in turns with cuBLAS (cuBLASLt with a fused epilogue), in
one process on one GPU, each rendered from the current template and from other versions of it:

    git show REV:templates/gemm/hopper.cu.j2 > before.cu.j2
    python3 docs/scripts/gemm_turns.py "8192,3072,768 bf16 nt:bias;4096,4096,11008 fp16 nt" configs.json before.cu.j2

Problems as ``docs/scripts/gemm_timing.py`` takes them (shape, type, layout with an optional
epilogue), separated by ``;``. ``configs.json``: a list of parameter dicts (missing parameters
take the family's defaults). Every (config, template) is compiled on all cores, checked by the
workers' verification (outputs poisoned, float64 reference), then timed with the peer by
``HeldTimer.time_each`` (the workers' flush, held events, REPS repetitions in turns) and once more
each by ``triton.testing.do_bench``. Prints a line a kernel, the fastest first: its median, TFLOPS
and the peer's time over its own by both methods.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import gemm_timing  # noqa: E402  (this folder's scripts: the problem's parsing and its peer; the timing)
from in_turns import template_versions, time_versions  # noqa: E402

from templates.gemm import render as gemm_render  # noqa: E402
from workers.gpu import GpuBench  # noqa: E402

FAMILY = gemm_timing.FAMILY


def _label(config: dict, version: str) -> str:
    kind = "ping-pong" if config.get("PINGPONG") else ("cooperative, persistent" if config["PERSISTENT"] else "cooperative")
    return f"{config['BLOCK_M']}x{config['BLOCK_N']} {config['STAGES']} stages {kind}, C {config['C_STORE']} | {version}"


def main(problems: str, config_file: str, others: list[str]) -> None:
    configs = [{**FAMILY.default_params(), **c} for c in json.loads(Path(config_file).read_text())]
    bench = GpuBench(0)
    with template_versions(gemm_render, "wgmma", others) as switch:
        for spec in problems.split(";"):
            problem = gemm_timing.parse(*spec.split())
            time_versions(FAMILY, problem, configs, switch, bench, _label, ("peer", gemm_timing.peer(problem)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
