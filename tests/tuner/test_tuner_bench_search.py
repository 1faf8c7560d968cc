"""`tuner bench-search`: samplers compared on a landscape recorded on an H200."""

from __future__ import annotations

import json

import pytest

from tuner.reports.bench_search import bench_search, load, plot, run
from tuner_doubles import LANDSCAPE, ROOT, run_cli



@pytest.fixture(scope="module")
def report():
    return bench_search([LANDSCAPE], seeds=3, samplers=("tpe", "random"))


def test_report_has_the_promised_json_shape(report):
    data = report.to_json()
    assert set(data["samplers"]) == {"tpe", "random"}  # tpe-warm needs a second landscape
    assert data["samplers"]["tpe"]["runs"] == 3
    for stats in data["samplers"].values():
        assert {"median_trials_2pct", "p90_trials_2pct", "median_trials_5pct", "median_trials_tie"} <= set(stats)
        assert 1 <= stats["median_trials_5pct"] <= stats["median_trials_2pct"] <= data["space_size"]
        assert 1 <= stats["median_trials_tie"] <= data["space_size"]
    assert data["space_size"] == 744 and data["seeds"] == 3
    assert set(data["not_applicable"]) == {"cmaes", "gp"}


def test_each_run_reaches_the_threshold_it_reports(report):
    for result in report.samplers.values():
        for two, curve in zip(result.trials_2pct, result.curves):
            assert len(curve) == two and curve[-1] <= 1.02 and min(curve[:-1] or [2.0]) > 1.02
            assert all(a >= b for a, b in zip(curve, curve[1:]))  # best so far never worsens


def _two_stage_warp_specialized(tmp_path):
    """The landscape's configs of two stages, warp-specialized: 124 of its 744, two of them
    failed. Optuna's TPE takes about 35 s to ask its way through all 744 on the 2-core CI
    machine, and about 1 s through these."""
    data = json.loads(LANDSCAPE.read_text())
    data["entries"] = [e for e in data["entries"]
                       if e["params"]["STAGES"] == 2 and e["params"]["WARP_SPECIALIZED"] == 1]
    path = tmp_path / LANDSCAPE.name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("name", "in_flight", "whole"), [
    ("grid", 1, True), ("tpe", 16, True), ("optuna-tpe", 16, False),
    pytest.param("optuna-tpe", 16, True, marks=pytest.mark.soak),  # as on the 124 above
])
def test_a_run_counts_each_config_once_and_can_measure_everything(name, in_flight, whole, tmp_path):
    land = load(LANDSCAPE if whole else _two_stage_warp_specialized(tmp_path))
    assert whole or (land.valid == 124 and sum(v == float("inf") for v in land.values.values()) == 2)
    unreachable = land.__class__(**{**land.__dict__, "best": land.best / 2})  # 2% never reached
    five, two, curve, tie = run(unreachable, name, 0, in_flight)
    assert two == five == land.valid and len(curve) == land.valid  # every valid config measured


def test_warm_start_from_the_winner_finds_it_first():
    land = load(LANDSCAPE)
    for name, in_flight in (("tpe", 1), ("tpe", 16), ("optuna-tpe", 16)):
        assert run(land, name, 0, in_flight, first=[land.winner]) == (1, 1, [1.0], 1)


def test_tpe_start_measures_the_family_starting_points_first():
    from storage import params_key

    land = load(LANDSCAPE)
    points = [p for p in land.family.starting_points(land.problem, land.limits) if land.space.contains(p)]
    assert points and len(points) < len(land.family.starting_points(land.problem, land.limits))  # TMA ones: not recorded
    starts = [land.values[params_key(p)] / land.best for p in points]
    expected = [min(starts[:i + 1]) for i in range(len(starts))]  # best so far over the starting points
    report = bench_search([LANDSCAPE], seeds=2, samplers=("tpe-start",))
    for curve in report.samplers["tpe-start"].curves:
        head = curve[:len(starts)]
        assert head == pytest.approx(expected[:len(head)])
        assert len(head) == len(starts) or head[-1] <= 1.02  # stopped early only once within 2%


def test_plot_writes_a_png(report, tmp_path):
    pytest.importorskip("matplotlib")
    path = plot(report, tmp_path / "search.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_json_and_bad_file(tmp_path):
    done = run_cli("bench-search", str(LANDSCAPE), "--seeds", "1", "--samplers", "tpe", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["samplers"]["tpe"]["median_trials_2pct"] >= 1
    bad = run_cli("bench-search", str(tmp_path / "none.json"), cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("tuner: error: cannot read landscape")
    assert len(bad.stderr.strip().splitlines()) == 1


def test_tpe_warm_runs_only_where_a_study_would_warm_start():
    data = ROOT / "tests" / "data"
    fp16_peer = data / "attention_4x8x512x64-fp16-causal_h200.json"
    bf16 = data / "attention_4x8x1024x64-bf16-causal_h200.json"  # no peer of its dtype here
    report = bench_search([LANDSCAPE, fp16_peer, bf16], seeds=1, samplers=("tpe-warm",))
    stats = report.samplers["tpe-warm"].stats()
    assert stats["runs"] == 2
    assert set(stats["median_trials_2pct_by_landscape"]) == {LANDSCAPE.name, fp16_peer.name}
    alone = bench_search([LANDSCAPE, bf16], seeds=1, samplers=("tpe-warm",))
    assert alone.samplers == {}


def test_the_old_sampler_names_run_as_their_new_ones(caplog):
    report = bench_search([LANDSCAPE], seeds=1, samplers=("tpe-batch",))
    assert set(report.samplers) == {"tpe"}
    assert "'tpe-batch' is now called 'tpe'" in caplog.text


def test_a_run_reaches_a_tie_when_a_config_within_the_bests_interval_is_measured():
    """The best's interval (half its IQR, a 1% floor) and another config's overlap: measuring that
    one first is a tie with the best at once, though it is not within 2%; one far off is not."""
    from storage import params_key

    land = load(LANDSCAPE)
    best_key = params_key(land.winner)
    near = min((k for k, v in land.values.items() if k != best_key and v < float("inf")),
               key=lambda k: land.values[k])
    gap = land.values[near] / land.best - 1
    wide = {**land.intervals, best_key: 2 * land.best * gap, near: 0.0}  # the best's noise covers the gap
    noisy = land.__class__(**{**land.__dict__, "intervals": wide})
    result = run(noisy, "tpe", 0, 1, first=[json.loads(near)])
    assert result.tie == 1 and (result.two > 1 or gap <= 0.02)
    narrow = land.__class__(**{**land.__dict__, "intervals": {k: 0.0 for k in land.intervals}})
    far = max((k for k, v in land.values.items() if v < float("inf")), key=lambda k: land.values[k])
    assert run(narrow, "tpe", 0, 1, first=[json.loads(far)]).tie > 1
