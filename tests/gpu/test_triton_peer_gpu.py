"""The Triton peer on a real GPU against a float64 reference, every row, outputs poisoned first.

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_triton_peer_gpu.py``. Skipped where no GPU
is visible or Triton is missing. The autotuned tests tune over a small space (a few seconds a
key rather than a minute); every tile shape of the full space is checked on its own, without the
autotuner.
"""

from __future__ import annotations

import math
import re

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from templates.attention import triton_peer as peer  # noqa: E402
from templates.attention.problem import TOLERANCE  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# Two configs of different tile shapes, one of each per side of BLOCK_M == BLOCK_N.
TEST_SPACE = ((64, 32, 2, 4), (128, 64, 3, 8))


@pytest.fixture(autouse=True)
def small_space(monkeypatch):
    monkeypatch.setattr(peer, "CONFIG_SPACE", TEST_SPACE)


def _inputs(b, h, s, d, dtype, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(b, h, s, d, device="cuda", dtype=DTYPES[dtype], generator=generator) for _ in range(3)]


def _reference(q, k, v, causal):
    """float64 on the GPU, every row."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[-2]
        above = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _check(out, q, k, v, causal, dtype):
    assert not torch.isnan(out).any(), "NaN left in the output (an element not written?)"
    assert torch.isfinite(out).all()
    ref = _reference(q, k, v, causal)
    error = ((out.double() - ref).norm() / ref.norm()).item()
    assert error < TOLERANCE[dtype], f"relative error {error:.2e} above {TOLERANCE[dtype]:.0e}"
    return error


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 96, 128, 256])
@pytest.mark.parametrize("s", [1, 65, 1000, 4097])
def test_autotuned_matches_the_reference(s, d, dtype, causal):
    q, k, v = _inputs(2, 3, s, d, dtype, seed=s * 7 + d)
    before = [t.clone() for t in (q, k, v)]
    out = torch.full_like(q, float("nan"))
    returned = peer.attention(q, k, v, causal, out=out)
    torch.cuda.synchronize()
    assert returned is out
    _check(out, q, k, v, causal, dtype)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v))), "the kernel changed its inputs"
    again = peer.attention(q, k, v, causal)  # tuned by now: a fresh output, the same values
    assert torch.equal(again, out)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("d", "dtype"), [(64, "bf16"), (96, "bf16"), (128, "fp16")])  # 96: a masked 128-column tile
@pytest.mark.parametrize("block_m,block_n", [(64, 32), (64, 64), (64, 128), (128, 32), (128, 64), (128, 128)])
def test_every_tile_shape_matches_the_reference(block_m, block_n, d, dtype, causal):
    """S=65 and 1000 divide by neither tile; S=256 by both (no tail block)."""
    stages, warps = (2, 8) if block_m == 128 else (3, 4)
    for s in (65, 256, 1000):
        q, k, v = _inputs(2, 3, s, d, dtype, seed=s)
        out = torch.full_like(q, float("nan"))
        peer._launch(q, k, v, causal, (block_m, block_n, stages, warps), out=out)
        torch.cuda.synchronize()
        _check(out, q, k, v, causal, dtype)


def test_tune_reports_the_config_and_its_seconds_once_per_key():
    q, k, v = _inputs(1, 4, 300, 64, "fp16", seed=1)
    first = peer.tune(q, k, v, causal=True)
    assert not first.already_tuned
    assert first.seconds > 0
    assert re.fullmatch(r"BLOCK_M=(64|128) BLOCK_N=(32|64|128) stages=[234] warps=[48]", first.config)
    assert first.config in {peer.config_text(*c) for c in TEST_SPACE}
    second = peer.tune(q, k, v, causal=True)
    assert second.already_tuned
    assert (second.seconds, second.config) == (first.seconds, first.config)
    # the key holds B*H, causal and the dtype: each of these is a new key
    assert not peer.tune(*_inputs(2, 4, 300, 64, "fp16", seed=2), causal=True).already_tuned
    assert not peer.tune(q, k, v, causal=False).already_tuned
    assert not peer.tune(*(t.bfloat16() for t in (q, k, v)), causal=True).already_tuned
    assert peer.tune(q, k, v, causal=True).already_tuned


def test_attention_tunes_the_key_too():
    q, k, v = _inputs(1, 2, 130, 128, "bf16", seed=3)
    peer.attention(q, k, v, causal=False)
    assert peer.tune(q, k, v, causal=False).already_tuned


def test_inputs_are_checked():
    q, k, v = _inputs(1, 1, 16, 64, "fp16", seed=4)
    with pytest.raises(ValueError, match="head dimension"):
        peer.attention(*(torch.zeros(1, 1, 16, 32, device="cuda", dtype=torch.float16) for _ in range(3)))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        peer.attention(q.float(), k.float(), v.float())
    with pytest.raises(ValueError, match="contiguous"):
        peer.attention(q, k.transpose(-1, -2).contiguous().transpose(-1, -2), v)
    with pytest.raises(ValueError, match="out is"):
        peer.attention(q, k, v, out=torch.empty(1, 1, 17, 64, device="cuda", dtype=torch.float16))


def test_available():
    assert peer.available()
