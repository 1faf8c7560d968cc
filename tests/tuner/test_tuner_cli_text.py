"""What the CLI prints about a study's time and its winner."""

from __future__ import annotations

from types import SimpleNamespace

from tuner.cli.text import best_line, time_line


def _result(**fields):
    base = dict(elapsed_s=4.0, gpu_busy_s=3.0, kernel_busy_s=2.4, flush_busy_s=0.24, measured=100)
    return SimpleNamespace(**{**base, **fields})


def test_the_time_line_gives_each_share_of_the_studys_wall_time():
    line = time_line(_result())
    assert line == "4s (3.0 s GPU busy, 75%; kernels 2.4 s, 60%; L2 flushes 0.2 s, 6%), 1500 trials/min"


def test_a_replayed_study_has_no_gpu_shares():
    line = time_line(_result(gpu_busy_s=0.0, kernel_busy_s=0.0, flush_busy_s=0.0))
    assert line == "4s (0.0 s GPU busy), 1500 trials/min"


def test_the_best_line_names_the_retimed_median_and_the_config():
    winner = SimpleNamespace(median_ms=0.0206, tflops=104.0, retime=object(), params={"BLOCK_M": 64})
    assert best_line(winner) == "0.0206 ms re-timed, 104.0 TFLOPS {BLOCK_M: 64}"
