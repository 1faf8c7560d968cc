from __future__ import annotations

import json
import os

import pytest

from templates.family import Problem
from worker_doubles import FAKE_DEVICE
from workers.errors import WorkerError
from workers.replay import ReplayBench, load_landscape, save_landscape
from workers.results import Measurement, Resources, Timing, measurement_from_json, measurement_to_json

PROBLEM = Problem((4, 16, 4096, 128), "fp16", (("causal", True),))


def test_measurement_json_round_trip():
    m = Measurement(ok=True, timing=Timing(1.0, 0.9, 1.5, 0.2, 40), error=1e-3, max_abs_error=2e-3,
                    resources=Resources(128, 0, 0, 0, 0), cubin_hash="ab", compile_seconds=1.5,
                    gpu_seconds=0.7, kernel_seconds=0.5, flush_seconds=0.1, clocks={"sm_mhz": 1980})
    assert measurement_from_json(json.loads(json.dumps(measurement_to_json(m)))) == m
    f = Measurement.failed("compile", "nvcc failed", detail="log")
    assert measurement_from_json(measurement_to_json(f)) == f


def test_landscape_round_trip_and_bench(tmp_path):
    ok = Measurement(ok=True, timing=Timing(1.0, 0.9, 1.5, 0.2, 40))
    bad = Measurement.failed("resources", "too much smem")
    path = save_landscape(tmp_path / "l.json", device=FAKE_DEVICE, family="attention", problem=PROBLEM,
                          template_hash="h", entries=[({"a": 1, "b": 2}, ok), ({"a": 2, "b": 2}, bad)])
    land = load_landscape(path)
    assert land.device == FAKE_DEVICE and land.problem == PROBLEM and len(land.entries) == 2
    mask = os.umask(0o022)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask  # as any file written here, not private
    bench = ReplayBench(path)
    assert bench.measure(None, None, "attention", PROBLEM, params={"b": 2, "a": 1}).replayed
    assert bench.measure(None, None, "attention", PROBLEM, params={"a": 2, "b": 2}).failure == "resources"
    missing = bench.measure(None, None, "attention", PROBLEM, params={"a": 3, "b": 2})
    assert missing.failure == "invalid" and missing.reason == "not in the recorded landscape"


def test_malformed_landscape_is_one_line(tmp_path):
    path = tmp_path / "l.json"
    path.write_text('{"format": 99}')
    with pytest.raises(WorkerError, match="unknown format") as info:
        load_landscape(path)
    assert "\n" not in str(info.value)
    with pytest.raises(WorkerError, match="cannot read"):
        load_landscape(tmp_path / "absent.json")


def test_configs_recorded_before_the_space_grew_are_completed(tmp_path):
    from templates import get_family

    family = get_family("attention")
    old = {k: v for k, v in family.default_params().items() if k in ("BLOCK_M", "BLOCK_N", "NUM_WARPS", "STAGES",
                                                                      "SMEM_LAYOUT", "WARP_SPECIALIZED", "Q_IN_REGS", "MMA")}
    assert len(old) < len(family.params)  # the space has grown since such a landscape was recorded
    ok = Measurement(ok=True, timing=Timing(1.0, 0.9, 1.5, 0.2, 40))
    path = save_landscape(tmp_path / "l.json", device=FAKE_DEVICE, family="attention", problem=PROBLEM,
                          template_hash="old", entries=[(old, ok)])
    (params, _), = load_landscape(path).entries
    assert params == family.default_params()  # each new parameter at its first choice
    bench = ReplayBench(path)
    assert bench.measure(None, None, "attention", PROBLEM, params=family.default_params()).ok
    assert bench.measure(None, None, "attention", PROBLEM, params=old).ok
    tma = dict(family.default_params(), LOADS="tma")
    assert bench.measure(None, None, "attention", PROBLEM, params=tma).reason == "not in the recorded landscape"


def test_a_packed_request_measures_what_the_pools_separate_arguments_would(tmp_path):
    """The pool sends a bench one pickled request a trial (``workers.request``): the bench's
    ``measure`` gets the same binary, launch, problem, params and options as from separate
    arguments, and a replay answers the same."""
    from templates.family import KernelArg, Launch, TensorMap
    from workers.request import TakesRequests, pack
    from workers.results import Binary

    class Recording(TakesRequests):
        def measure(self, binary, launch, family_ref, problem, *, params=None, **options):
            return binary, launch, family_ref, problem, params, options

    binary = Binary(cubin=b"\x7fELF" + bytes(range(256)) * 4, kernel="attn",
                    resources=Resources(96, 0, 0, 0, 0), source_hash="s" * 64, cubin_hash="c" * 64, toolkit="nvrtc 13.0", options=("-O3",),
                    compile_seconds=0.4)
    launch = Launch("attn", (8, 1, 1), (384, 1, 1), 99_000,
                    (KernelArg("tensormap", TensorMap("q", 2, (64, 512, 32), (128, 65536), (64, 128, 1))),
                     KernelArg("buffer", "o"), KernelArg("i32", 512), KernelArg("f32", 0.18)))
    options = {"seed": 3, "abort_above_ms": 0.25, "flush_l2": True}
    sent = (binary, launch, PROBLEM, {"a": 1, "b": (2, 3)}, options)
    for by_value in (False, True):  # plain pickle, or Ray's cloudpickle (a family shipped by value)
        got = Recording().measure_request("attention", pack(*sent, by_value=by_value))
        assert got == (binary, launch, "attention", PROBLEM, {"a": 1, "b": (2, 3)}, options)
    ok = Measurement(ok=True, timing=Timing(1.0, 0.9, 1.5, 0.2, 40))
    path = save_landscape(tmp_path / "l.json", device=FAKE_DEVICE, family="attention", problem=PROBLEM,
                          template_hash="h", entries=[({"a": 1, "b": 2}, ok)])
    bench = ReplayBench(path)
    direct = bench.measure(None, None, "attention", PROBLEM, params={"a": 1, "b": 2}, seed=3)
    assert bench.measure_request("attention", pack(None, None, PROBLEM, {"a": 1, "b": 2}, {"seed": 3})) == direct
