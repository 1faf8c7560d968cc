"""`tuner guard` and `tuner report --package` on the CPU: the decision rule, the samples between
tuned problems, the table written back and read again by the package, the any-shape rule giving
way to a sample that took the vendor's path, the report, and bad input. The GPU's timing is the
one part replaced (``FakeBench`` for ``guard_bench.GpuBench``); the real one runs in
tests/gpu/test_torch_export_gpu.py."""

from __future__ import annotations

import importlib
import json
import sys

import pytest

import tuner.answers.guard as guard_module
from templates import get_family
from templates.family import H100_LIMITS
from tuner.answers.guard import decide, guard_package, sample_problems
from tuner.answers.guard_bench import Comparison, Timing
from tuner.answers.torch_export import render_package
from tuner.answers.torch_runtime import rule_choice
from tuner.cli.commands import main
from tuner.errors import UsageError

torch = pytest.importorskip("torch")

NAME = "tuned_gemm_guard_test"
GPU = "NVIDIA H100 80GB HBM3"
LINEAR = {"layout": "nt", "epilogue": "none"}
TUNED = [((m, 4096, 4096), "bf16", LINEAR) for m in (1, 2, 4, 64, 512)] + [
    ((64, 8192, 4096), "bf16", LINEAR), ((2048, 2048, 2048), "fp16", {"layout": "nn", "epilogue": "none"})]
# ours, its IQR, the vendor's, its IQR (ms); or why ours is wrong
TIMES = {
    "1x4096x4096-bf16-epilogue=none-layout=nt": (0.010, 0.0004, 0.012, 0.0004),  # ours, clearly
    "2x4096x4096-bf16-epilogue=none-layout=nt": (0.0119, 0.0, 0.012, 0.0),  # within the 1% floor
    "4x4096x4096-bf16-epilogue=none-layout=nt": (0.010, 0.0, 0.011, 0.0),
    "64x4096x4096-bf16-epilogue=none-layout=nt": (0.020, 0.0, 0.015, 0.0),  # the vendor's
    "512x4096x4096-bf16-epilogue=none-layout=nt": (0.050, 0.001, 0.060, 0.001),
    "64x8192x4096-bf16-epilogue=none-layout=nt": "ours differs from the vendor's result",
    "2048x2048x2048-fp16-epilogue=none-layout=nn": (0.10, 0.002, 0.12, 0.002),
    # the samples between them
    "3x4096x4096-bf16-epilogue=none-layout=nt": (0.010, 0.0, 0.012, 0.0),
    "16x4096x4096-bf16-epilogue=none-layout=nt": (0.0132, 0.0, 0.012, 0.0),  # the rule's pick 10% slower
    "181x4096x4096-bf16-epilogue=none-layout=nt": (0.030, 0.0, 0.040, 0.0),
}


class FakeBench:
    """``GpuBench`` with the times above, and what it was asked."""

    def __init__(self, gpu: str = GPU) -> None:
        self.gpu, self.asked, self.closed = gpu, [], False

    def gpu_name(self) -> str:
        return self.gpu

    def compare(self, package, choice, problem, reps):
        self.asked.append((choice, problem, reps))
        times = TIMES[problem.key]
        if isinstance(times, str):
            return Comparison(wrong=times)
        return Comparison(Timing(*times[:2]), Timing(*times[2:]))

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory: pytest.TempPathFactory):
    """A gemm package of the problems above (its table made here, no kernels: nothing runs them),
    imported."""
    family = get_family("gemm")
    rows = []
    for shape, dtype, flags in TUNED:
        problem = family.parse_problem(shape, dtype, flags)
        params = family.complete(family.starting_points(problem, H100_LIMITS)[0])
        rows.append({"key": problem.key, "shape": list(problem.shape), "dtype": dtype, "flags": dict(problem.flags),
                     "params": params, "median_ms": 0.01, "interval_ms": None, "use": "ours",
                     "kernel": f"gemm_{problem.key}", "template_hash": family.template_hash, "study": "s",
                     "limits": H100_LIMITS.to_json()})
    table = {"format": 1, "family": "gemm", "dtypes": list(family.dtypes), "problems": rows,
             "stamp": {"gpu": GPU, "template_hash": family.template_hash, "written": "2026-11-28T00:00:00+00:00"}}
    out = tmp_path_factory.mktemp("guard")
    folder = out / NAME
    folder.mkdir()
    (folder / "table.json").write_text(json.dumps(table, indent=2))
    (folder / "__init__.py").write_text(render_package(NAME, family, table))
    sys.path.insert(0, str(out))
    try:
        yield folder, importlib.import_module(NAME), (folder / "table.json").read_text()
    finally:
        sys.path.remove(str(out))


@pytest.fixture
def package(package_dir):
    """The package with its table as exported (each test guards it afresh)."""
    folder, module, exported = package_dir
    (folder / "table.json").write_text(exported)
    module.load_table()
    return folder, module


def test_ours_is_kept_only_where_it_wins_by_more_than_the_spread():
    assert decide(Timing(2.5, 1.5), Timing(4.0, 2.0))[0] == "ours"  # won 1.5, spread hypot(0.75, 1) = 1.25
    use, reason = decide(Timing(2.75, 1.5), Timing(4.0, 2.0))  # won exactly the spread: a tie
    assert use == "vendor" and "within the spread" in reason
    assert decide(Timing(98.5, 0.5), Timing(100.0, 0.5))[0] == "ours"  # spread 0.35 < the floor, 1.0
    assert decide(Timing(99.0, 0.5), Timing(100.0, 0.5))[0] == "vendor"  # won the floor exactly
    assert decide(Timing(99.5, 0.0), Timing(100.0, 0.0))[0] == "vendor"  # no spread: the floor still holds
    use, reason = decide(Timing(1.0, 0.0), Timing(1.0, 0.0))
    assert (use, reason) == ("vendor", "ours and the vendor's path alike, 1 ms")
    assert "the vendor's path faster by 0.5 ms (50.0%)" in decide(Timing(1.5, 0.0), Timing(1.0, 0.0))[1]


def test_samples_lie_between_rows_that_differ_in_the_most_varied_dimension():
    rows = [{"shape": list(shape), "dtype": dtype, "flags": flags} for shape, dtype, flags in TUNED]
    rows.append({"shape": [3, 4096, 4096], "dtype": "bf16", "flags": {"layout": "nn", "epilogue": "none"}})  # alone
    assert [shape for shape, _, _ in sample_problems(rows)] == [
        (3, 4096, 4096), (16, 4096, 4096), (181, 4096, 4096)]  # along M; none between 1 and 2, none along N
    assert {(dtype, tuple(sorted(flags.items()))) for _, dtype, flags in sample_problems(rows)} == {
        ("bf16", tuple(sorted(LINEAR.items())))}
    two = [{"shape": [1, 8, s, 64], "dtype": "fp16", "flags": {"causal": True}} for s in (512, 2048)]
    assert sample_problems(two) == [((1, 8, 1024, 64), "fp16", {"causal": True})]
    layer = [{"shape": [m, n, k], "dtype": "bf16", "flags": LINEAR} for m in (1, 4, 16)
             for n, k in ((6144, 4096), (4096, 4096), (4096, 14336))]  # a model's projections
    assert [shape for shape, _, _ in sample_problems(layer)] == [
        (2, 4096, 4096), (2, 4096, 14336), (2, 6144, 4096), (8, 4096, 4096), (8, 4096, 14336), (8, 6144, 4096)]
    assert sample_problems(two[:1]) == []


def test_the_guard_times_each_row_and_sample_and_writes_the_table(package):
    folder, module = package
    bench = FakeBench()
    written = guard_package(folder, reps=7, bench=bench)
    assert bench.closed and {reps for _, _, reps in bench.asked} == {7}
    table = json.loads((folder / "table.json").read_text())
    assert table == written and table["guard"]["gpu"] == GPU and table["guard"]["reps"] == 7
    rows = {row["key"].split("-")[0]: row for row in table["problems"]}
    assert {key: row["use"] for key, row in rows.items()} == {
        "1x4096x4096": "ours", "2x4096x4096": "vendor", "4x4096x4096": "ours", "64x4096x4096": "vendor",
        "512x4096x4096": "ours", "64x8192x4096": "vendor", "2048x2048x2048": "ours"}
    assert rows["1x4096x4096"]["ours_ms"] == 0.010 and rows["1x4096x4096"]["vendor_iqr_ms"] == 0.0004
    assert rows["64x8192x4096"]["guard_reason"] == "ours differs from the vendor's result"
    assert rows["64x8192x4096"]["ours_ms"] is None
    assert all(row["guard_reason"] for row in rows.values())
    tuned_choices = [choice for choice, _, _ in bench.asked if choice.kernel is not None]
    assert sorted(c.kernel for c in tuned_choices) == sorted(f"gemm_{row['key']}" for row in table["problems"])
    samples = {s["key"].split("-")[0]: s for s in table["samples"]}
    assert set(samples) == {"3x4096x4096", "16x4096x4096", "181x4096x4096"}  # along M, the most varied
    sixteen = samples["16x4096x4096"]
    assert sixteen["use"] == "vendor" and sixteen["loss"] == pytest.approx(0.1) and sixteen["params"]
    assert sixteen["source"] in {row["key"] for row in table["problems"]} and sixteen["shape"] == [16, 4096, 4096]
    assert samples["181x4096x4096"]["loss"] == 0.0 and samples["181x4096x4096"]["use"] == "ours"
    assert module.TABLE["guard"] == table["guard"]  # the package read it again
    row = rows["64x4096x4096"]
    assert module.choose(row["shape"], row["dtype"], row["flags"]).use == "vendor"


def test_an_untuned_problem_takes_the_rules_pick_only_between_timed_wins_on_its_line(package):
    folder, module = package
    exported = json.loads((folder / "table.json").read_text())
    assert rule_choice(exported, (14, 4096, 4096), "bf16", LINEAR).use == "ours"  # no guard data: as exported
    guard_package(folder, bench=FakeBench())
    near_sixteen = module.choose((14, 4096, 4096), "bf16", LINEAR)  # between 4 (ours) and the sample at 16
    assert near_sixteen.use == "vendor" and "16x4096x4096" in near_sixteen.reason and near_sixteen.params
    assert module.choose((200, 4096, 4096), "bf16", LINEAR).use == "ours"  # between 181 and 512: both ours
    assert module.choose((3, 4096, 4096), "bf16", LINEAR).use == "ours"  # the sample itself
    assert module.choose((50, 4096, 4096), "bf16", LINEAR).use == "vendor"  # the row at 64 lost
    beyond = module.choose((1000, 4096, 4096), "bf16", LINEAR)  # past the last timed one
    assert beyond.use == "vendor" and "on both sides" in beyond.reason
    assert module.choose((3000, 2048, 2048), "fp16", {"layout": "nn"}).use == "vendor"  # a line of one problem
    between_n = module.choose((64, 7000, 4096), "bf16", LINEAR)  # N between 4096 (lost) and 8192 (wrong)
    assert between_n.use == "vendor" and "64x4096x4096" in between_n.reason
    guard_package(folder, samples=False, bench=FakeBench())
    without = module.choose((14, 4096, 4096), "bf16", LINEAR)  # now between the rows at 4 and at 64
    assert "samples" not in module.TABLE and without.use == "vendor" and "64x4096x4096" in without.reason


def test_a_comparison_that_fails_takes_the_vendors_path_with_why(package):
    folder, _ = package

    class Failing(FakeBench):
        def compare(self, package, choice, problem, reps):
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    table = guard_package(folder, samples=False, bench=Failing())
    assert {row["use"] for row in table["problems"]} == {"vendor"}
    assert table["problems"][0]["guard_reason"] == "not timed: CUDA error: an illegal memory access was encountered"


def test_the_report_is_a_markdown_table_of_rows_and_samples(package, capsys):
    folder, _ = package
    assert main(["report", "--package", str(folder)]) == 0
    before = capsys.readouterr().out
    assert "not timed against the vendor's path yet" in before and "| 512x4096x4096-bf16" in before
    guard_package(folder, bench=FakeBench())
    assert main(["report", "--package", str(folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"gemm for the {GPU}: timed against the vendor's path on the {GPU} on ")
    assert lines[2] == "| problem | kind | varying | ours ms | vendor ms | use | rule's loss | why |"
    body = [line for line in lines[4:] if line]
    assert [line.split(" | ")[0].removeprefix("| ").split("-")[0] for line in body] == [
        "1x4096x4096", "2x4096x4096", "3x4096x4096", "4x4096x4096", "16x4096x4096", "64x4096x4096",
        "64x8192x4096", "181x4096x4096", "512x4096x4096", "2048x2048x2048"]
    sixteen = next(line for line in body if line.startswith("| 16x4096x4096"))
    assert "| sample | dim 0: 16 | " in sixteen and "| 0.0132 | 0.0120 | vendor | +10.0% |" in sixteen
    assert "| 2048x2048x2048-fp16-epilogue=none-layout=nn | tuned |  | 0.1000 |" in body[-1]  # varies in none
    assert main(["report", "--package", str(folder), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["guard"]["gpu"] == GPU and len(document["problems"]) == 10
    one = next(e for e in document["problems"] if e["key"].startswith("1x4096x4096"))
    assert one["kind"] == "tuned" and one["varying"] == {"dim": 0, "value": 1} and one["ours_ms"] == 0.010


def test_bad_input_is_one_line(package, tmp_path, capsys, monkeypatch):
    folder, _ = package
    exported = (folder / "table.json").read_text()
    for argv in (["guard", str(tmp_path)], ["report", "--package", str(tmp_path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "is not a package of tuner export-torch" in err and err.count("\n") == 1
    assert main(["report"]) == 2 and "give STUDY and -o FILE" in capsys.readouterr().err
    assert main(["report", "1", "--package", str(folder)]) == 2
    with pytest.raises(SystemExit) as exited:  # argparse's
        main(["guard", str(folder), "--reps", "0"])
    assert exited.value.code == 2 and "--reps: must be at least 1" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["guard", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU here" in err and err.count("\n") == 1
    with pytest.raises(UsageError) as error:
        guard_package(folder, bench=FakeBench(gpu="NVIDIA H200"))
    assert f"exported for the {GPU}, this GPU is the NVIDIA H200" in str(error.value) and "\n" not in str(error.value)
    monkeypatch.setattr(guard_module, "GpuBench", lambda: FakeBench(gpu="NVIDIA H200"))
    assert main(["guard", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "this GPU is the NVIDIA H200" in err and err.count("\n") == 1
    assert (folder / "table.json").read_text() == exported  # nothing written


def test_the_command_prints_the_report_and_writes_the_table(package, capsys, monkeypatch):
    folder, _ = package
    monkeypatch.setattr(guard_module, "GpuBench", FakeBench)
    assert main(["guard", str(folder), "--reps", "5", "--no-samples"]) == 0
    out = capsys.readouterr().out
    assert "| 64x4096x4096-bf16-epilogue=none-layout=nt | tuned |" in out and "| sample |" not in out
    assert out.rstrip().endswith("table.json")
    assert json.loads((folder / "table.json").read_text())["guard"]["reps"] == 5
