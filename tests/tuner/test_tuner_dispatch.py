"""`tuner export-dispatch`: the C++ header of a family's tuned winners, generated from databases of
several tuned problems (attention's from the replay landscapes, gemm's from chosen configs),
compiled by nvcc with its test program (tests/dispatch/check_dispatch.cu, -arch=sm_90a), and run
here without a GPU: its picks are tuner/answers/rule.py's, its launches the family's, and its NVRTC path
compiles the embedded sources."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tuner
from deploy_tables import H200, attention_db, compile_program, gemm_db, nvrtc_env, store
from storage import open_repository
from templates import get_family
from tuner.answers.dispatch import table_bests
from tuner.answers.rule import pick_config
from tuner.api import device_limits
from tuner.cli.commands import main

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")

ATTENTION_QUERIES = [
    ((4, 8, 512, 64), "fp16", {"causal": True}),  # tuned
    ((1, 16, 2048, 64), "fp16", {"causal": True}),  # tuned
    ((3, 8, 700, 64), "fp16", {"causal": True}),
    ((1, 16, 1500, 64), "fp16", {"causal": True}),
    ((8, 8, 256, 64), "fp16", {"causal": True}),
    ((16, 16, 4096, 64), "fp16", {"causal": True}),
    ((2, 8, 1448, 64), "fp16", {"causal": True}),  # between two tuned problems
    ((2, 8, 1000, 128), "bf16", {"causal": False}),
    ((4, 16, 4096, 128), "fp16", {"causal": False}),
    ((1, 4, 77, 128), "fp16", {"causal": False}),
    ((1, 16, 3000, 128), "bf16", {"causal": True}),  # TMA, persistent
    ((3, 8, 777, 64), "fp16", {"causal": False}),  # TMA, persistent, TMA store
    ((2, 8, 1024, 128), "fp16", {"causal": True}),  # no tuned problem of this kind
    ((2, 8, 2048, 128), "fp16", {"causal": True}),  # nor of this one
    ((1, 32, 3000, 128, 8), "bf16", {"causal": True}),  # grouped-query: the tuned one's TMA winner
    ((2, 12, 700, 64, 4), "fp16", {"causal": True}),  # grouped-query: a plain winner (the group a distance)
    ((1, 8, 333, 64, 1), "fp16", {"causal": False}),  # multi-query
]
GEMM_QUERIES = [
    ((128, 4096, 4096), "bf16", {"layout": "nt"}),  # tuned
    ((48, 4096, 4096), "bf16", {"layout": "nt"}),  # 16x4096x4096's winner: A's rows as the MMA's N
    ((300, 40000, 4096), "bf16", {"layout": "nt"}),  # split-K's workspace too small, then the swap past M = 256
    ((64, 4096, 4096), "bf16", {"layout": "nt"}),
    ((129, 4096, 4096), "bf16", {"layout": "nt"}),
    ((100, 4096, 4095), "bf16", {"layout": "nt"}),  # K odd: A and B unaligned
    ((2000, 1000, 999), "bf16", {"layout": "nt"}),  # N even, K odd
    ((4096, 4096, 4096), "bf16", {"layout": "nt"}),
    ((1, 4096, 4096), "bf16", {"layout": "nt"}),
    ((1000, 1001, 1003), "bf16", {"layout": "nt"}),
    ((500, 500, 500), "fp16", {"layout": "nn", "epilogue": "bias_relu"}),
    ((500, 501, 500), "fp16", {"layout": "nn", "epilogue": "bias_relu"}),  # B unaligned, N odd
    ((33, 17, 9), "fp16", {"layout": "nn", "epilogue": "bias_relu"}),  # no winner is valid for it
    ((512, 512, 512), "fp16", {"layout": "tt", "epilogue": "bias_relu"}),  # no tuned problem of this kind
    ((256, 1024, 1024), "bf16", {"layout": "nt", "epilogue": "bias_gelu_tanh"}),  # tuned
    ((300, 1024, 1000), "bf16", {"layout": "nt", "epilogue": "bias_gelu_tanh"}),  # its winner, by the rule
    ((300, 1024, 1000), "bf16", {"layout": "nt", "epilogue": "bias_gelu"}),  # the erf form: no tuned problem
]


class Built:
    def __init__(self, family: str, db: str, out: Path, program: Path) -> None:
        self.family, self.db, self.out, self.program = get_family(family), db, out, program

    def ask(self, mode: str, shape: tuple[int, ...], dtype: str, flags: dict[str, Any]) -> dict[str, Any]:
        argv = [str(self.program), mode, ",".join(map(str, shape)), dtype]
        argv += [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in flags.items()]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=nvrtc_env())
        assert done.stdout.count("\n") == 1, (done.stdout, done.stderr)
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Built]:
    """Both families' databases, headers (through the command line) and test programs (nvcc)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on the PATH")
    root = tmp_path_factory.mktemp("dispatch")
    found = {}
    for family, make in (("attention", attention_db), ("gemm", gemm_db)):
        db = f"sqlite:///{root / family}.db"
        make(db)
        assert main(["export-dispatch", family, "--db", db, "-o", str(root / family)]) == 0
        found[family] = (db, root / family)
    with ThreadPoolExecutor(2) as pool:
        programs = dict(zip(found, pool.map(lambda f: compile_program(f, found[f][1]), found)))
    return {f: Built(f, db, out, programs[f]) for f, (db, out) in found.items()}


def _rule(built: Built, shape, dtype, flags):
    """tuner/answers/rule.py's pick over the bests the header holds."""
    family = built.family
    problem = family.parse_problem(shape, dtype, flags)
    with open_repository(built.db) as repo:
        bests = table_bests(family, repo.bests(family.name))
        limits_of = device_limits(repo.studies())
    own = [b for b in bests if b.shape == problem.shape and b.dtype == dtype and b.flags == dict(problem.flags)]
    if own:
        return problem, own[0].params, None
    return problem, None, pick_config(family, problem, bests, limits_of, limits_of(bests[0]))


@needs_nvcc
@pytest.mark.parametrize("family,queries", [("attention", ATTENTION_QUERIES), ("gemm", GEMM_QUERIES)])
def test_the_headers_pick_is_the_rules_and_its_launch_the_familys(built, family, queries):
    built = built[family]
    served = refused = 0
    for shape, dtype, flags in queries:
        problem, own, pick = _rule(built, shape, dtype, flags)
        got = built.ask("pick", shape, dtype, flags)
        if own is not None:  # a tuned problem: its own winner
            assert (got["source"], got["measured"], got["passed_over"]) == (problem.key, True, [])
            params = own
        elif pick is None or pick.distance is None:
            # the rule reaches past the problems at a finite distance (another dtype, flags or, for
            # attention, D), or to a starting point: neither is compiled in the table
            assert "error" in got and got["error"].startswith(f"{family} {problem.key}: "), got
            refused += 1
            continue
        else:
            assert got["source"] == pick.source, (problem.key, got)
            assert got["measured"] is False and got["distance"] == pytest.approx(pick.distance, rel=1e-15)
            assert [line.split(":")[0] for line in got["passed_over"]] == \
                [line.split(":")[0] for line in pick.passed_over]
            assert got["passed_over"] == list(pick.passed_over)  # the family's reasons, word for word
            params = pick.params
        served += 1
        expected = built.family.launch(built.family.complete(params), problem).to_json()
        plan = got["plan"]
        for key in ("kernel", "grid", "block", "dynamic_smem_bytes"):
            assert plan[key] == expected[key], (problem.key, key)
        assert plan["grid_x_max_blocks_per_sm"] == expected.get("grid_x_max_blocks_per_sm", 0)
        assert plan["workspace"] == expected.get("workspace", [])
        assert len(plan["args"]) == len(expected["args"])
        for mine, theirs in zip(plan["args"], expected["args"]):
            if mine["kind"] == "f32":  # passed as a 32-bit float either way
                assert np.float32(mine["value"]) == np.float32(theirs["value"])
            else:
                assert mine == theirs, problem.key
    assert served >= 8 and refused >= 2


@needs_nvcc
def test_a_nearer_winner_the_shape_refuses_is_passed_over_with_the_familys_reason(built):
    got = built["gemm"].ask("pick", (48, 4096, 4096), "bf16", {"layout": "nt"})
    assert got["source"] == "16x4096x4096-bf16-epilogue=none-layout=nt"
    assert got["passed_over"] == ["128x4096x4096-bf16-epilogue=none-layout=nt: tile: BLOCK_M=128 is wider "
                                  "than the problem needs (64)"]


@needs_nvcc
def test_gelu_tanh_is_a_flag_of_the_header_and_takes_its_own_winner(built):
    flags = {"layout": "nt", "epilogue": "bias_gelu_tanh"}
    got = built["gemm"].ask("pick", (300, 1024, 1000), "bf16", flags)
    assert got["source"] == "256x1024x1024-bf16-epilogue=bias_gelu_tanh-layout=nt" and got["measured"] is False
    assert built["gemm"].ask("pick", (256, 1024, 1024), "bf16", flags)["measured"] is True
    assert "bias_gelu_tanh" in built["gemm"].ask("pick", (300, 1024, 1000), "bf16", {"epilogue": "gelu"})["error"]


@needs_nvcc
def test_bad_problems_get_one_line(built):
    attention = built["attention"]
    assert attention.ask("pick", (2, 8, 512, 80), "fp16", {})["error"] == \
        "attention: unsupported head dimension D: attention supports [64, 96, 128, 256]"
    assert attention.ask("pick", (2, 8, 512, 64), "fp64", {})["error"].startswith("attention: unsupported dtype 'fp64'")
    assert attention.ask("pick", (2, 8, 512, 64), "fp16", {"masked": "true"})["error"] == \
        "attention: unknown problem flag 'masked'"
    assert built["gemm"].ask("pick", (1, 2), "bf16", {})["error"] == "gemm: a shape is three positive integers M,N,K"


@needs_nvcc
def test_without_a_gpu_run_ends_in_one_line(built):
    got = built["attention"].ask("run", (4, 8, 512, 64), "fp16", {"causal": True})
    assert set(got) == {"error"} and "\n" not in got["error"]


@needs_nvcc
@pytest.mark.parametrize("family,query", [("gemm", ((100, 4096, 4095), "bf16", {"layout": "nt"})),
                                          ("attention", ((3, 8, 700, 64), "fp16", {"causal": True}))])
def test_the_embedded_sources_compile_through_nvrtc(built, family, query):
    env = nvrtc_env()
    if "TUNED_NVRTC" not in env:
        pytest.skip("no NVRTC library of the tuner's wheel")
    got = built[family].ask("compile", *query)
    assert "error" not in got, got
    assert got["cubin_bytes"] > 1000


def test_the_header_holds_every_tuned_problem_of_the_gpu(tmp_path):
    db = f"sqlite:///{tmp_path / 'a.db'}"
    keys = attention_db(db)
    path = tuner.export_dispatch("attention", out_dir=tmp_path / "out", db=db)
    text = path.read_text()
    entries = re.findall(r'^    \{"([^"]+)", \d+, \{', text, flags=re.M)
    assert entries == sorted(keys) and len(keys) >= 5
    listed = json.loads(path.with_suffix(".json").read_text())
    family = get_family("attention")
    with open_repository(db) as repo:
        winners = {f"{'x'.join(map(str, b.shape))}-{b.dtype}"
                   f"{'-causal' if b.flags['causal'] else ''}": family.complete(b.params)
                   for b in repo.bests("attention")}
    assert {p["key"]: p["params"] for p in listed["problems"]} == winners
    assert listed["gpu"] == H200["name"] and listed["template_hash"] == family.template_hash
    # each distinct source once, as a raw string, and every kernel names one
    sources = re.findall(r'static const char SOURCE_(\d+)\[\] = R"tuned_src\(', text)
    assert sources == [str(i) for i in range(len(sources))]
    assert len(set(family.render(p, family.problem_from_spec({"shape": k.split("-")[0].split("x"),
                                                               "dtype": k.split("-")[1],
                                                               "flags": {"causal": "causal" in k}}))
                   for k, p in winners.items())) == len(sources)


def test_several_gpus_need_device_and_nothing_current_is_one_line(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'a.db'}"
    attention_db(db)
    params = get_family("attention").complete({})
    store(db, "attention", (4, 8, 512, 64), "fp16", {"causal": True}, [(params, 0.1)],
          device=dict(H200, name="NVIDIA H100 80GB HBM3"))
    assert main(["export-dispatch", "attention", "--db", db, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == ("tuner: error: attention is tuned on several GPUs (NVIDIA H100 80GB HBM3, NVIDIA H200): "
                   "choose one with --device\n")
    assert main(["export-dispatch", "attention", "--db", db, "-o", str(tmp_path / "out"),
                 "--device", "NVIDIA H200"]) == 0
    assert "attention_dispatch.h" in capsys.readouterr().out
    assert main(["export-dispatch", "gemm", "--db", db, "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith("tuner: error: no winner of gemm's current template")
    assert not (tmp_path / "out" / "gemm_dispatch.h").exists()


def test_e4m3_winners_are_left_out_of_an_export_with_a_warning_and_alone_refused(tmp_path, capsys):
    from deploy_tables import GEMM

    db = f"sqlite:///{tmp_path / 'g.db'}"
    fp8 = ((256, 1024, 1024), "e4m3", {"layout": "nt"})
    store(db, "gemm", *fp8, [(GEMM, 0.05)])
    assert main(["export-dispatch", "gemm", "--db", db, "-o", str(tmp_path / "only")]) == 2
    assert capsys.readouterr().err.startswith("tuner: error: 256x1024x1024-e4m3")
    assert not (tmp_path / "only" / "gemm_dispatch.h").exists()
    winners = gemm_db(db)
    capsys.readouterr()
    assert main(["export-dispatch", "gemm", "--db", db, "-o", str(tmp_path / "out")]) == 0
    header = (tmp_path / "out" / "gemm_dispatch.h").read_text()
    assert all(f'{{"{key}", ' in header for key in winners)  # each winner's entry, and no e4m3 one
    assert '", 3, {256, 1024, 1024}, "e4m3"' not in header and "-e4m3-" not in header
    warned = [line.split(" ", 1)[1] for line in capsys.readouterr().err.splitlines() if "left out" in line]
    assert warned == ["gemm: 1 stored winner(s) left out (256x1024x1024-e4m3-epilogue=none-layout=nt-out_dtype=bf16-"
                      "scale=tensor): " + get_family("gemm").export_refusal(get_family("gemm").parse_problem(*fp8))]


def test_a_family_without_cpp_or_a_missing_database_is_one_line(tmp_path, capsys):
    family = str(Path(__file__).resolve().parents[2] / "docs" / "examples" / "row_softmax")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    store(db, family, (4096, 1000), "fp16", {}, [(get_family(family).default_params(), 0.01)])
    assert main(["export-dispatch", family, "--db", db, "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == ("tuner: error: row_softmax has no C++ dispatch (its family defines no "
                                       "dispatch_file)\n")
    assert main(["export-dispatch", "attention", "--db", f"sqlite:///{tmp_path / 'none.db'}", "-o",
                 str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith(f"tuner: error: no database at {tmp_path / 'none.db'}")
    assert not (tmp_path / "out").exists()
