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
                    gpu_seconds=0.7, kernel_seconds=0.5, flush_seconds=0.1, clocks={"sm_mhz": 1980},
                    advisories=("C7517: warpgroup.wait is injected in around line 9",))
    assert measurement_from_json(json.loads(json.dumps(measurement_to_json(m)))) == m
    f = Measurement.failed("compile", "nvcc failed", detail="log")
    assert measurement_from_json(measurement_to_json(f)) == f


def test_landscape_round_trip_and_bench(tmp_path):
    from templates import get_family

    base = get_family("attention").default_params()
    a, b, c = (dict(base, BLOCK_M=m) for m in (64, 128, 32))
    ok = Measurement(ok=True, timing=Timing(1.0, 0.9, 1.5, 0.2, 40))
    bad = Measurement.failed("resources", "too much smem")
    path = save_landscape(tmp_path / "l.json", device=FAKE_DEVICE, family="attention", problem=PROBLEM,
                          template_hash="h", entries=[(a, ok), (b, bad)])
    land = load_landscape(path)
    assert land.device == FAKE_DEVICE and land.problem == PROBLEM and len(land.entries) == 2
    mask = os.umask(0o022)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask  # as any file written here, not private
    bench = ReplayBench(path)
    assert bench.measure(None, None, "attention", PROBLEM, params=dict(reversed(a.items()))).replayed
    assert bench.measure(None, None, "attention", PROBLEM, params=b).failure == "resources"
    missing = bench.measure(None, None, "attention", PROBLEM, params=c)
    assert missing.failure == "invalid" and missing.reason == "not in the recorded landscape"


def test_a_landscape_named_json_gz_is_written_and_read_compressed(tmp_path):
    import gzip

    from templates import get_family

    entries = [(dict(get_family("attention").default_params(), BLOCK_M=m), Measurement(ok=True, timing=Timing(
        1.0 + m / 1000, 0.9, 1.5, 0.2, 40))) for m in (32, 64, 128)]
    keywords = dict(device=FAKE_DEVICE, family="attention", problem=PROBLEM, template_hash="h", entries=entries)
    plain = save_landscape(tmp_path / "l.json", **keywords)
    packed = save_landscape(tmp_path / "l.json.gz", **keywords)
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()  # the same JSON, compressed
    assert save_landscape(tmp_path / "again.json.gz", **keywords).read_bytes() == packed.read_bytes()
    assert load_landscape(packed) == load_landscape(plain)
    packed.write_bytes(plain.read_bytes())  # named .gz, not compressed: one line
    with pytest.raises(WorkerError, match=r"cannot read landscape .*l\.json\.gz: Not a gzipped file"):
        load_landscape(packed)
    packed.write_bytes(gzip.compress(plain.read_bytes())[:-20])  # cut short
    with pytest.raises(WorkerError, match=r"cannot read landscape .*l\.json\.gz: Compressed file ended"):
        load_landscape(packed)


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
    from templates import get_family

    ok = Measurement(ok=True, timing=Timing(1.0, 0.9, 1.5, 0.2, 40))
    config = get_family("attention").default_params()
    path = save_landscape(tmp_path / "l.json", device=FAKE_DEVICE, family="attention", problem=PROBLEM,
                          template_hash="h", entries=[(config, ok)])
    bench = ReplayBench(path)
    direct = bench.measure(None, None, "attention", PROBLEM, params=config, seed=3)
    assert bench.measure_request("attention", pack(None, None, PROBLEM, config, {"seed": 3})) == direct


def _edited(tmp_path, edit):
    """The attention landscape the family ships, changed by ``edit(data)``, as a file."""
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "templates" / "attention" / "landscapes"
    data = json.loads(next(shipped.glob("*.json")).read_text())
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


def _every_median(data, value):
    for entry in data["entries"]:
        if entry["measurement"]["ok"]:
            entry["measurement"]["timing"]["median_ms"] = value


def _gemm_params(data):
    data["entries"][3]["params"] = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 1}


@pytest.mark.parametrize("edit, says", [
    (lambda d: _every_median(d, -1), "entry 1 is ok with median_ms -1.0, not a positive number of milliseconds"),
    (lambda d: _every_median(d, float("nan")), "entry 1 is ok with median_ms nan, not a positive number of milliseconds"),
    (lambda d: d["entries"][2]["measurement"].update(timing=None),
     "is malformed: ValueError: a successful measurement needs a timing"),
    (lambda d: d.update(entries=[]), "records no configs (its 'entries' are empty)"),
    (_gemm_params, "entry 4 is not in attention's space: unknown parameter 'BLOCK_K'"),
    (lambda d: d["entries"][0]["params"].update(BLOCK_M=100),
     "entry 1 is not in attention's space: BLOCK_M=100 is not one of [64, 128, 32, 192]"),
    (lambda d: d.update(problem={"shape": [2, 8, 1024, 80], "dtype": "fp16", "flags": {"causal": True}}),
     "records a problem attention refuses: unsupported head dimension D=80: attention supports [64, 96, 128, 256]"),
    (lambda d: d.update(problem={"shape": [2, 8, 1024, 64], "dtype": "fp16", "flags": {"masked": True}}),
     "records a problem attention refuses: unknown problem flag 'masked' (flags: causal)"),
])
def test_a_landscape_is_checked_on_load(tmp_path, edit, says):
    """A landscape that records nothing, an ok time that is not a positive number of ms (a
    winner of -1 ms), a config or a problem not of the family's: one line naming the file."""
    path = _edited(tmp_path, edit)
    with pytest.raises(WorkerError) as caught:
        load_landscape(path)
    assert str(caught.value) in (f"landscape {path}: {says}", f"landscape {path} {says}"), str(caught.value)


def test_every_shipped_and_test_landscape_loads():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    paths = sorted([*root.glob("templates/*/landscapes/*.json"), *root.glob("templates/*/landscapes/*.json.gz")])
    paths += sorted((root / "tests" / "data").glob("*.json"))
    assert len(paths) >= 11 and any(p.name.endswith(".json.gz") for p in paths)
    for path in paths:
        family = str(root / "docs" / "examples" / "row_softmax") if path.name.startswith("row_softmax") else None
        assert load_landscape(path, family).entries, path
