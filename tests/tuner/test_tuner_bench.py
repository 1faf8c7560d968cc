"""`tuner bench`: stored winners re-timed beside peers (GPU parts with a test-double bench)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import pytest

import tuner
from templates import get_family
from tuner.cli.text import bench_table
from tuner.reports.bench import BenchRow, PeerTiming, _bench_rows, blocks_per_sm
from tuner_doubles import PROBLEM, latency_ms, run_cli
from workers.driver import gpu_count
import workers.peers
from workers.peers import OURS, PeerResult, time_peers
from workers.results import Measurement, Resources, Timing



class _LocalDouble:
    """LocalBench's interface; the GPU cannot run here. It times every config at 0.9x its
    stored latency and records what it was asked to measure."""

    def __init__(self, device_name):
        self.device = type("Device", (), {"name": device_name})()
        self.asked, self.launched = [], []

    def measure(self, family, problem, source, launch, options, *, seed=0):
        params = dict(line.split()[1:] for line in source.splitlines() if line.startswith("#define"))
        self.asked.append((family, problem.key, source))
        median = 0.9 * latency_ms({k: int(v) for k, v in params.items()})
        return Measurement(ok=True, timing=Timing(median, median, median, 0.0, 20), error=1e-4,
                           resources=Resources(96, 0, 0, 0, 0))

    def do_bench(self, family, problem, source, launch, options, *, seed=0):
        return 1.5  # the second method's median, whatever the kernel

    @contextmanager
    def launcher(self, family, problem, source, launch, options, *, seed=0):
        self.launched.append(source)
        yield lambda: None


def test_bench_re_times_the_stored_winner_of_each_problem(toy, db, tuned):
    problem = toy.parse_problem(*PROBLEM)
    local = _LocalDouble("NVIDIA H100 80GB HBM3")
    rows = _bench_rows(toy, [problem, toy.parse_problem(PROBLEM[0], PROBLEM[1], {"causal": True})], local,
                       db=db, seed=0, peers=True)
    winner = tuner.best("toy", *PROBLEM, db=db)
    assert rows[0].params == winner.params
    assert rows[0].median_ms == pytest.approx(0.9 * winner.median_ms)  # re-timed, not read back
    assert rows[0].tflops == pytest.approx(toy.flops(problem) / rows[0].median_ms / 1e9)
    assert rows[0].registers == 96 and rows[0].blocks_per_sm >= 1
    assert rows[0].peers == {} and rows[0].ratio("flash") is None  # no peers for a toy family
    assert rows[0].check_ms == 1.5  # and the second method's time, beside the first
    assert local.asked[0][2] == toy.render(winner.params, problem)
    assert rows[1].params is None and "not tuned on NVIDIA H100" in rows[1].note
    assert len(local.asked) == 1


def test_ours_is_timed_in_turns_with_the_peers_and_its_ratio_divides_those_times(toy, db, tuned, monkeypatch):
    asked = []

    def peers_with_ours(family, problem, *, seed=0, ours=None, **_):
        asked.append(ours)
        return {OURS: PeerResult(OURS, 0.5, None, check_ms=0.55),
                "cublas": PeerResult("cublas", 0.45, 1e-4, check_ms=0.44)}

    monkeypatch.setattr(workers.peers, "time_peers", peers_with_ours)
    local = _LocalDouble("NVIDIA H100 80GB HBM3")
    problem = toy.parse_problem(*PROBLEM)
    row = _bench_rows(toy, [problem], local, db=db, seed=0, peers=True)[0]
    assert callable(asked[0]) and local.launched == [local.asked[0][2]]  # the winner, loaded beside torch
    assert row.median_ms == 0.5 and row.check_ms == 0.55  # the turns' median, not the time alone
    assert row.tflops == pytest.approx(toy.flops(problem) / 0.5 / 1e9)
    assert row.ratio("cublas") == pytest.approx(0.9) and row.check_ratio("cublas") == pytest.approx(0.8)
    assert OURS not in row.peers


def test_rows_of_another_gpu_are_not_benched(toy, db, tuned):
    rows = _bench_rows(toy, [toy.parse_problem(*PROBLEM)], _LocalDouble("NVIDIA H200"), db=db, seed=0,
                       peers=False)
    assert rows[0].median_ms is None and "not tuned on NVIDIA H200" in rows[0].note


@pytest.mark.parametrize(
    "registers, threads, smem, expected",
    [(255, 128, 64 * 1024, 2), (128, 128, 16 * 1024, 4), (64, 64, 0, 16), (32, 1024, 0, 2),
     (168, 288, 100 * 1024, 1), (96, 128, 150 * 1024, 1)],
)
def test_blocks_per_sm(registers, threads, smem, expected):
    assert blocks_per_sm(registers, threads, smem) == expected


def test_the_attention_suite_covers_the_issue_shapes():
    suite = get_family("attention").suite
    assert len(suite) == 32
    assert {s for s, _, _ in suite} >= {(1, 8, 512, 64), (2, 16, 1000, 64), (1, 16, 4097, 128)}
    for shape, dtype, flags in suite:
        get_family("attention").parse_problem(shape, dtype, flags)


def test_no_peers_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    problem = get_family("attention").parse_problem("1,8,512,64", "fp16")
    assert time_peers("attention", problem) == {}
    assert time_peers("toy", problem) == {}


def test_cli_bench_without_a_gpu_says_so_in_one_line(tmp_path):
    if gpu_count():
        pytest.skip("a GPU is visible here")
    done = run_cli("bench", "attention", "--db", f"sqlite:///{tmp_path}/t.db", cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "tuner: error: no GPU is visible: `tuner bench` times kernels on this machine's GPU"]


def test_ratios_by_both_methods_and_their_disagreement_are_shown():
    problem = get_family("attention").parse_problem("1,8,512,64", "fp16")
    peers = {
        "flash": PeerTiming("flash", 0.020, 50.0, 3e-4, check_ms=0.0205),
        "cudnn": PeerTiming("cudnn", 0.010, 99.0, 3e-4, check_ms=0.0130),
        "efficient": PeerTiming("efficient", None, None, None, "No available kernel. Aborting execution."),
        "triton": PeerTiming("triton", 0.011, 90.0, 3e-4, "autotuned to BLOCK_M=64", 0.011, 12.34),
    }
    row = BenchRow(problem, {"BLOCK_M": 64}, 0.010, 99.0, 2e-4, 128, 1024, 2, peers=peers, check_ms=0.0100)
    assert row.ratio("flash") == pytest.approx(2.0) and row.check_ratio("flash") == pytest.approx(2.05)
    assert not row.disagrees("flash")  # 2.5% apart
    assert row.disagrees("cudnn")  # 1.00x against 1.30x
    assert row.ratio("efficient") is None and not row.disagrees("efficient")
    assert BenchRow(problem, None, 0.01, 1.0, 0.0, 1, 1, 1, peers=peers).check_ratio("flash") is None
    lines = bench_table([row])
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cells[head.index("vs flash")] == "2.000x/2.05x"
    assert cells[head.index("vs cudnn")] == "1.000x/1.30x !"
    assert cells[head.index("vs efficient")] == "-" and cells[head.index("efficient TFLOPS")] == "-"
    assert "1x8x512x64-fp16 efficient: - (No available kernel. Aborting execution.)" in lines
    assert "1x8x512x64-fp16 triton: autotuned to BLOCK_M=64, 12.3 s of autotuning" in lines


def test_a_ratio_within_the_noise_of_both_timings_is_called_a_tie():
    """Ours and a peer timed in turns: a ratio their intervals explain is marked ``tie``; one
    they do not, is not."""
    from tuner.reports.bench import _interval

    problem = get_family("attention").parse_problem("1,8,512,64", "fp16")
    close = PeerResult("cudnn", 0.1010, None, iqr_ms=0.002, repetitions=100)
    far = PeerResult("flash", 0.1300, None, iqr_ms=0.002, repetitions=100)
    ours = PeerResult(OURS, 0.1000, None, iqr_ms=0.002, repetitions=100)
    assert _interval(ours) == pytest.approx(0.1000 * (0.01 ** 2 + 0.0025 ** 2) ** 0.5)
    peers = {p.name: PeerTiming(p.name, p.median_ms, 1.0, None, interval_ms=_interval(p)) for p in (close, far)}
    row = BenchRow(problem, {"BLOCK_M": 64}, 0.1000, 1.0, 0.0, 1, 1, 1, peers=peers, interval_ms=_interval(ours))
    assert row.tie("cudnn") and not row.tie("flash")
    cells = bench_table([row])[2]
    assert "1.010x tie" in cells and "1.300x |" in cells


def test_cli_bench_takes_a_yaml_list_of_problems(tmp_path, monkeypatch, capsys):
    from tuner.cli import commands

    asked = []
    monkeypatch.setattr(commands, "run_bench", lambda family, problems, **kw: asked.append(problems) or [])
    shapes = tmp_path / "fa3.yaml"
    shapes.write_text("- {shape: [32, 32, 512, 64], dtype: bf16, flags: {causal: true}}\n"
                      "- {shape: '1,16,16384,128', dtype: fp16}\n")
    assert commands.main(["bench", "attention", "--shapes", str(shapes)]) == 0
    assert asked == [[((32, 32, 512, 64), "bf16", {"causal": True}), ((1, 16, 16384, 128), "fp16", {"causal": False})]]
    assert commands.main(["bench", "attention", "--shapes", str(shapes), "--dtype", "fp16"]) == 0
    assert asked[-1] == [((1, 16, 16384, 128), "fp16", {"causal": False})]
    capsys.readouterr()
    assert commands.main(["bench", "attention", "--shapes", str(shapes), "--shape", "1,8,512,64", "--dtype", "fp16"]) == 2
    assert capsys.readouterr().err.strip() == "tuner: error: --shape and --shapes: give one"
    shapes.write_text("- {shape: [1, 8, 512, 65], dtype: fp16}\n")
    assert commands.main(["bench", "attention", "--shapes", str(shapes)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"tuner: error: {shapes}: entry 1: ")


def test_fa3s_benchmark_points_are_a_list_bench_takes():
    from pathlib import Path

    from tuner.study.many import read_problems

    listed = read_problems(get_family("attention"), Path(__file__).parents[2] / "docs" / "problems" / "fa3_forward.yaml")
    assert len(listed) == 36 and {p.shape[3] for p in listed} == {64, 128, 256}
    assert all(p.shape[0] * p.shape[2] == 16384 and p.shape[1] * p.shape[3] == 2048 for p in listed)
