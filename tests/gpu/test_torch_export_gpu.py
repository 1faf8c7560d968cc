"""`tuner export-torch`'s package on a real GPU: studies tuned on it, exported, imported, and the
ops run on CUDA tensors (a tuned shape: the shipped cubin; an untuned one: the rule's pick,
compiled on its first call) against torch, under torch.compile(fullgraph=True) with inductor,
inside a captured CUDA graph, and refused (or sent to the vendor's path) under another GPU's stamp;
then `tuner guard` times the packages' kernels against the vendor's path (last: it rewrites the
tables, restored after).

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_torch_export_gpu.py``. Skipped without a GPU.
"""

from __future__ import annotations

import importlib
import json
import sys

import pytest

import tuner
from templates.attention.problem import TOLERANCE as ATTENTION_TOLERANCE
from templates.gemm.problem import TOLERANCE as GEMM_TOLERANCE
from tuner.cli.commands import main

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")

GEMM_TUNED = [((512, 1024, 1024), "bf16", {"layout": "nt"}),
              ((256, 512, 512), "fp16", {"layout": "nn", "epilogue": "bias_relu"}),
              ((128, 1024, 1024), "bf16", {"layout": "nt"}),  # with the first: a sample at M=256 for the guard
              ((256, 512, 512), "bf16", {"layout": "nt", "epilogue": "bias_gelu_tanh"})]
ATTENTION_TUNED = [((1, 4, 512, 64), "fp16", {"causal": True}), ((1, 8, 512, 64, 2), "fp16", {"causal": True})]
GEMM_NAME, ATTENTION_NAME = "tuned_gemm_gpu_test", "tuned_attention_gpu_test"


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("torch_export_gpu")
    db = f"sqlite:///{folder / 'tuner.db'}"
    for shape, dtype, flags in GEMM_TUNED:
        tuner.tune("gemm", shape, dtype, flags, trials=4, retime=0, db=db, seed=0)
    for shape, dtype, flags in ATTENTION_TUNED:
        tuner.tune("attention", shape, dtype, flags, trials=4, retime=0, db=db, seed=0)
    out = folder / "out"
    tuner.export_torch("gemm", out_dir=out, db=db, name=GEMM_NAME)
    tuner.export_torch("attention", out_dir=out, db=db, name=ATTENTION_NAME)
    sys.path.insert(0, str(out))
    try:
        yield {"out": out, "gemm": importlib.import_module(GEMM_NAME),
               "attention": importlib.import_module(ATTENTION_NAME)}
    finally:
        sys.path.remove(str(out))


def _relative(got, ref) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("m,n,k,dtype,bias,epilogue,tuned", [
    (512, 1024, 1024, torch.bfloat16, False, "none", True),
    (256, 512, 512, torch.float16, True, "relu", True),
    (300, 1024, 1000, torch.bfloat16, False, "none", False),  # the rule's pick
    (200, 500, 512, torch.float16, True, "gelu", False),
    (256, 512, 512, torch.bfloat16, True, "gelu_tanh", True),
    (300, 512, 500, torch.bfloat16, True, "gelu_tanh", False),
])
def test_gemm_runs_ours_on_the_gpu_as_torch_does(packages, m, n, k, dtype, bias, epilogue, tuned):
    gemm = packages["gemm"]
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, dtype=dtype, device="cuda", generator=generator)
    w = torch.randn(n, k, dtype=dtype, device="cuda", generator=generator)
    b = w.t() if dtype == torch.bfloat16 else w.t().contiguous()  # "nt" and "nn"
    vector = torch.randn(n, dtype=dtype, device="cuda", generator=generator) if bias else None
    choice = gemm.gemm_choice(a, b, vector, epilogue)
    assert choice.use == "ours" and (choice.reason == "tuned") == tuned
    got = gemm.gemm(a, b, vector, epilogue=epilogue)
    reference = a.double() @ b.double() + (vector.double() if bias else 0)
    reference = {"none": reference, "relu": torch.relu(reference), "gelu": F.gelu(reference),
                 "gelu_tanh": F.gelu(reference, approximate="tanh")}[epilogue]
    name = "fp16" if dtype == torch.float16 else "bf16"
    assert got.shape == (m, n) and got.dtype == dtype and _relative(got, reference) <= GEMM_TOLERANCE[name]


@pytest.mark.parametrize("shape,kv_heads,causal,tuned", [
    ((1, 4, 512, 64), 4, True, True), ((2, 4, 700, 64), 4, True, False),
    ((1, 8, 512, 64), 2, True, True), ((2, 8, 333, 64), 2, True, False), ((1, 8, 300, 64), 1, False, False)])
def test_attention_runs_ours_on_the_gpu_as_sdpa_does(packages, shape, kv_heads, causal, tuned):
    attention = packages["attention"]
    generator = torch.Generator(device="cuda").manual_seed(0)
    kv_shape = (shape[0], kv_heads, *shape[2:])
    q = torch.randn(shape, dtype=torch.float16, device="cuda", generator=generator)
    k, v = (torch.randn(kv_shape, dtype=torch.float16, device="cuda", generator=generator) for _ in range(2))
    choice = attention.attention_choice(q, k, v, causal)
    assert choice.use == "ours" and (choice.reason == "tuned") == tuned
    got = attention.attention(q, k, v, causal=causal)
    reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                               enable_gqa=kv_heads != shape[1])
    assert _relative(got, reference) <= ATTENTION_TOLERANCE["fp16"]


def test_gelu_tanh_is_like_for_like_with_cublaslts_fused_epilogue(packages):
    """The tuned kernel's bias + GELU (tanh) and the vendor's path (torch._addmm_activation:
    cuBLASLt's fused epilogue) agree within the family's tolerance, and both with F.gelu's tanh
    form in float64. In fp32 (no TF32) the fused epilogue is the tanh form to 1e-4, and 1e-4 or
    more from the erf form."""
    gemm = packages["gemm"]
    generator = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(256, 512, dtype=torch.bfloat16, device="cuda", generator=generator)
    w = torch.randn(512, 512, dtype=torch.bfloat16, device="cuda", generator=generator)
    bias = torch.randn(512, dtype=torch.bfloat16, device="cuda", generator=generator)
    assert gemm.gemm_choice(a, w.t(), bias, "gelu_tanh").reason == "tuned"
    ours = gemm.gemm(a, w.t(), bias, epilogue="gelu_tanh")
    vendor = torch._addmm_activation(bias, a, w.t(), use_gelu=True)
    exact = a.double() @ w.t().double() + bias.double()
    assert _relative(ours, vendor) <= GEMM_TOLERANCE["bf16"]
    assert _relative(vendor, F.gelu(exact, approximate="tanh")) <= GEMM_TOLERANCE["bf16"]
    assert _relative(ours, F.gelu(exact, approximate="tanh")) <= GEMM_TOLERANCE["bf16"]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        fused = torch._addmm_activation(bias.float(), a.float(), w.float().t(), use_gelu=True).double()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert (fused - F.gelu(exact, approximate="tanh")).abs().max() < 1e-4 <= (fused - F.gelu(exact)).abs().max()


def test_fp32_on_the_gpu_takes_the_vendors_path(packages):
    a, b = torch.randn(64, 96, device="cuda"), torch.randn(96, 32, device="cuda")
    assert packages["gemm"].gemm_choice(a, b).use == "vendor"
    torch.testing.assert_close(packages["gemm"].gemm(a, b), a @ b)


def test_the_ops_compile_whole_with_inductor_and_replay_in_a_cuda_graph(packages):
    gemm, attention = packages["gemm"], packages["attention"]
    x = torch.randn(512, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    q, k, v = (torch.randn(1, 4, 512, 64, dtype=torch.float16, device="cuda") for _ in range(3))

    def step(x, w, q, k, v):
        return gemm.gemm(x, w.t()) * 2, attention.attention(q, k, v, causal=True)

    eager = step(x, w, q, k, v)
    compiled = torch.compile(step, fullgraph=True)
    for got, want in zip(compiled(x, w, q, k, v), eager):
        torch.testing.assert_close(got, want)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = step(x, w, q, k, v)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, step(x, w, q, k, v)):
        torch.testing.assert_close(got, want)


def test_another_gpus_stamp_is_one_line_at_the_first_call_unless_vendor_is_chosen(packages, monkeypatch):
    gemm = packages["gemm"]
    path = packages["out"] / GEMM_NAME / "table.json"
    original = path.read_text()
    table = json.loads(original)
    table["stamp"]["gpu"] = "NVIDIA Another GPU"
    path.write_text(json.dumps(table))
    a = torch.randn(512, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    try:
        gemm.load_table()
        with pytest.raises(gemm.WrongGPU) as error:
            gemm.gemm(a, w.t())
        assert "\n" not in str(error.value) and "NVIDIA Another GPU" in str(error.value)
        monkeypatch.setattr(gemm, "fallback", "vendor")
        gemm.load_table()
        torch.testing.assert_close(gemm.gemm(a, w.t()), a @ w.t())
    finally:
        path.write_text(original)
        gemm.load_table()


def _guarded(package, folder, argv: list[str], capsys) -> tuple[dict, dict]:
    """`tuner guard` run on ``folder``: (the table it wrote, the JSON it printed); the table as
    exported is written back by the caller."""
    assert main(["guard", str(folder), *argv, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    table = json.loads((folder / "table.json").read_text())
    assert table["guard"]["gpu"] == torch.cuda.get_device_name() and package.TABLE["guard"] == table["guard"]
    for row in [*table["problems"], *table.get("samples", [])]:
        assert row["ours_ms"] > 0 and row["vendor_ms"] > 0 and row["use"] in ("ours", "vendor"), row
        assert row["ours_iqr_ms"] >= 0 and row["vendor_iqr_ms"] >= 0, row
        assert row["guard_reason"] and "differs" not in row["guard_reason"] and "fails" not in row["guard_reason"]
    return table, document


def test_the_guard_times_each_gemm_row_and_sample_against_the_vendors_path(packages, capsys):
    gemm = packages["gemm"]
    folder = packages["out"] / GEMM_NAME
    original = (folder / "table.json").read_text()
    try:
        table, document = _guarded(gemm, folder, ["--reps", "20"], capsys)
        assert table["guard"]["reps"] == 20 and len(table["problems"]) == len(GEMM_TUNED)
        [sample] = table["samples"]
        assert sample["shape"] == [256, 1024, 1024] and sample["loss"] >= 0 and sample["params"]
        assert len(document["problems"]) == len(GEMM_TUNED) + 1
        a = torch.randn(256, 1024, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
        assert gemm.gemm_choice(a, w.t()).use == sample["use"]  # the sample's own problem
        assert _relative(gemm.gemm(a, w.t()), a.double() @ w.t().double()) <= GEMM_TOLERANCE["bf16"]
    finally:
        (folder / "table.json").write_text(original)
        gemm.load_table()


def test_the_guard_times_attention_against_sdpa(packages, capsys):
    attention = packages["attention"]
    folder = packages["out"] / ATTENTION_NAME
    original = (folder / "table.json").read_text()
    try:
        table, _ = _guarded(attention, folder, ["--reps", "20", "--no-samples"], capsys)
        assert "samples" not in table and len(table["problems"]) == len(ATTENTION_TUNED)
    finally:
        (folder / "table.json").write_text(original)
        attention.load_table()
