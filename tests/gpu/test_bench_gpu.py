"""`tuner bench` on a real GPU: a tuned winner re-timed beside torch SDPA in one process."""

from __future__ import annotations

import pytest

import tuner

pytestmark = pytest.mark.gpu


def test_bench_times_the_winner_beside_sdpa(tmp_path):
    torch = pytest.importorskip("torch")
    assert torch.cuda.is_available()
    db = f"sqlite:///{tmp_path}/tuner.db"
    rows = tuner.bench("attention", [("1,8,512,64", "bf16", {"causal": True})], db=db, tune_trials=12)
    (row,) = rows
    assert row.params is not None and row.median_ms > 0 and row.error < 3e-2
    stored = tuner.best("attention", "1,8,512,64", "bf16", {"causal": True}, db=db)
    assert row.params == stored.params
    assert 0.5 < row.median_ms / stored.median_ms < 2.0  # same kernel, same GPU, another process
    assert row.registers and row.smem_bytes and row.blocks_per_sm >= 1
    flash = row.peers["flash"]
    assert flash.median_ms > 0 and flash.error < 3e-2 and row.ratio("flash") > 0
    assert set(row.peers) == {"flash", "cudnn", "efficient", "triton"}
    assert row.check_ms > 0 and row.check_ratio("flash") > 0  # the second method, beside the first
    triton = row.peers["triton"]
    assert triton.median_ms > 0 and triton.error < 3e-2 and triton.tune_seconds > 0
