"""Attention configs of the TMA path timed in turns with cuDNN, in one process on one GPU, each
rendered from the current template and from other versions of it:

    git show REV:templates/attention/hopper.cu.j2 > before.cu.j2
    python3 docs/scripts/attention_turns.py "8,16,2048,128;4,16,4096,128" fp16 configs.json before.cu.j2

``configs.json``: a list of parameter dicts over the TMA path's starting point (missing
parameters take it); a dtype of ``fp16:causal`` sets the mask. Every (config, template) is
compiled on all cores, checked by the workers' verification (outputs poisoned, float64 reference),
then timed with cuDNN by ``HeldTimer.time_each`` (the workers' flush, held events, REPS
repetitions in turns) and once more each by ``triton.testing.do_bench``. Prints a line a kernel,
the fastest first: its median, TFLOPS and cuDNN's time over its own by both methods.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from in_turns import template_versions, time_versions  # noqa: E402  (this folder's helper)

from templates import get_family  # noqa: E402
from templates.attention import render as attention_render  # noqa: E402
from templates.attention.peers import peer_calls  # noqa: E402
from templates.attention.starts import TMA  # noqa: E402
from workers.gpu import GpuBench  # noqa: E402

FAMILY = get_family("attention")


def _label(config: dict, version: str) -> str:
    return (f"{config['BLOCK_M']}x{config['BLOCK_N']} {config['STAGES']} stages pingpong {config['PINGPONG']} "
            f"{config['SCHEDULE']} {config['EPILOGUE']} {config['TILE_ORDER']} | {version}")


def main(shapes: str, dtype: str, config_file: str, others: list[str]) -> None:
    dtype, _, mask = dtype.partition(":")
    configs = [{**FAMILY.default_params(), **TMA, **c} for c in json.loads(Path(config_file).read_text())]
    bench = GpuBench(0)
    with template_versions(attention_render, "tma", others) as switch:
        for shape in shapes.split(";"):
            problem = FAMILY.parse_problem(shape, dtype, {"causal": mask == "causal"})
            cudnn = peer_calls(problem, FAMILY.inputs(problem, 0))["cudnn"].run
            time_versions(FAMILY, problem, configs, switch, bench, _label, ("cudnn", cudnn))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
