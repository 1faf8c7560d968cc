"""The Triton peer without torch or Triton: it imports, says it is unavailable, and prunes configs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from templates.attention import triton_peer as peer

ROOT = Path(__file__).resolve().parents[2]
HAS_TORCH_AND_TRITON = all(importlib.util.find_spec(name) is not None for name in ("torch", "triton"))


def test_importing_the_module_imports_neither_torch_nor_triton():
    code = ("import sys; import templates.attention.triton_peer as p; "
            "print('torch' in sys.modules, 'triton' in sys.modules, p.triton, p.tl)")
    shown = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert shown.stdout.split() == ["False", "False", "None", "None"]


@pytest.mark.skipif(HAS_TORCH_AND_TRITON, reason="torch and triton are installed here")
def test_unavailable_without_torch_and_triton():
    assert peer.available() is False
    with pytest.raises(peer.PeerUnavailable, match="needs torch and triton"):
        peer.attention(None, None, None, causal=True)
    with pytest.raises(peer.PeerUnavailable):
        peer.tune(None, None, None, causal=False)


def test_the_space_is_the_usual_one():
    assert len(peer.CONFIG_SPACE) == 2 * 3 * 3 * 2
    assert {c[0] for c in peer.CONFIG_SPACE} == {64, 128}
    assert {c[1] for c in peer.CONFIG_SPACE} == {32, 64, 128}
    assert {c[2] for c in peer.CONFIG_SPACE} == {2, 3, 4}
    assert {c[3] for c in peer.CONFIG_SPACE} == {4, 8}
    assert min(c[0] for c in peer.CONFIG_SPACE) == peer.MIN_BLOCK_M
    assert min(c[1] for c in peer.CONFIG_SPACE) == peer.MIN_BLOCK_N


def test_shared_memory_decides_for_long_sequences():
    # K and V tiles per stage plus Q: 128x128 tiles at D=128 fit in 3 stages, not in 4
    assert peer.shared_memory_bytes(128, 128, 4, 128) == (2 * 128 * 128 * 4 + 128 * 128) * 2
    assert not peer.fits(128, 128, 4, 128, 4096)
    assert peer.fits(128, 128, 3, 128, 4096)
    assert peer.fits(128, 128, 4, 64, 4096)
    assert not peer.fits(64, 128, 4, 128, 4096)
    kept = [c for c in peer.CONFIG_SPACE if peer.fits(*c[:3], 128, 4096)]
    assert len(kept) == 36 - 4  # BLOCK_N=128 with 4 stages, both BLOCK_M, both warps
    assert all(peer.fits(*c[:3], 64, 4096) for c in peer.CONFIG_SPACE)


@pytest.mark.parametrize(("seq_len", "block_ns", "block_ms"), [
    (1, {32}, {64}),
    (20, {32}, {64}),
    (33, {32, 64}, {64}),
    (64, {32, 64}, {64}),
    (65, {32, 64, 128}, {64, 128}),
    (1000, {32, 64, 128}, {64, 128}),
])
def test_tiles_longer_than_the_sequence_are_pruned(seq_len, block_ns, block_ms):
    kept = [c for c in peer.CONFIG_SPACE if peer.fits(*c[:3], 64, seq_len)]
    assert {c[1] for c in kept} == block_ns
    assert {c[0] for c in kept} == block_ms


def _config(block_m, block_n, stages, warps):
    return SimpleNamespace(kwargs={"BLOCK_M": block_m, "BLOCK_N": block_n}, num_stages=stages, num_warps=warps)


def test_prune_configs_reads_s_and_d_from_positional_or_keyword_arguments():
    configs = [_config(*c) for c in peer.CONFIG_SPACE]
    by_position = peer.prune_configs(configs, {"S": 4097, "HEAD_DIM": 128})
    by_keyword = peer.prune_configs(configs, {"S": 4097}, HEAD_DIM=128)
    assert by_position == by_keyword
    assert len(by_position) == 32
    assert all(peer.fits(*peer._config_tuple(c)[:3], 128, 4097) for c in by_position)
    tiny = peer.prune_configs(configs, {"S": 1, "HEAD_DIM": 64})
    assert {peer._config_tuple(c)[:2] for c in tiny} == {(64, 32)}


def test_prune_configs_keeps_one_config_when_fits_keeps_none():
    configs = [_config(128, 128, 4, 8), _config(128, 128, 3, 4), _config(128, 64, 4, 4)]
    kept = peer.prune_configs(configs, {"S": 8, "HEAD_DIM": 128})
    assert [peer._config_tuple(c) for c in kept] == [(128, 64, 4, 4)]  # the least shared memory


def test_config_text():
    assert peer.config_text(128, 64, 3, 8) == "BLOCK_M=128 BLOCK_N=64 stages=3 warps=8"
    assert peer.next_power_of_two(1) == 1
    assert peer.next_power_of_two(65) == 128
    assert peer.next_power_of_two(4096) == 4096


def test_tuned_peer_is_frozen():
    tuned = peer.TunedPeer(1.5, "BLOCK_M=64 BLOCK_N=32 stages=2 warps=4", already_tuned=False)
    with pytest.raises(AttributeError):
        tuned.seconds = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(("seq_len", "head_dim"), [(1, 64), (65, 128), (1000, 64), (4097, 128), (8, 128)])
def test_precompile_compiles_what_the_autotuner_will_time(seq_len, head_dim, monkeypatch):
    configs = [_config(*c) for c in peer.CONFIG_SPACE]
    pruned = [peer._config_tuple(c) for c in peer.prune_configs(configs, {"S": seq_len, "HEAD_DIM": head_dim})]
    assert peer.autotuned_configs(seq_len, head_dim) == pruned
    monkeypatch.setattr(peer, "CONFIG_SPACE", ((128, 128, 4, 8), (128, 64, 4, 4)))
    assert peer.autotuned_configs(8, 128) == [(128, 64, 4, 4)]  # the least shared memory, as prune_configs


@pytest.mark.skipif(HAS_TORCH_AND_TRITON, reason="torch and triton are installed here")
def test_precompile_needs_triton():
    with pytest.raises(peer.PeerUnavailable):
        peer.precompile([(16, 1000, 64, False, "fp16")])
