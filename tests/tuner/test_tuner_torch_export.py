"""`tuner export-torch`: a package of torch custom ops from studies tuned here on recorded
landscapes (gemm's two, recorded on an H100; attention's on an H200), imported and called on the
CPU: the ops registered, their fake implementations under torch.compile(fullgraph=True), the
vendor's path against torch, the dispatch's choice (the table's winner, the rule's pick as
`tuner best` gives it), the stamp's check, the `use` field and bad input. The kernels themselves
run in tests/gpu/test_torch_export_gpu.py."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

import tuner
from templates import get_family
from tuner.answers.torch_runtime import rule_kernel
from tuner.cli.commands import main
from tuner_doubles import ROOT

torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")

pytestmark = pytest.mark.usefixtures("module_ray")

GEMM_LANDSCAPES = {
    ((2048, 2048, 2048), "fp16", "nn"): ROOT / "templates/gemm/landscapes/gemm_2048x2048x2048-fp16-nn_h100.json",
    ((64, 4096, 14336), "bf16", "nt"): ROOT / "templates/gemm/landscapes/gemm_64x4096x14336-bf16-nt_h100.json",
}
ATTENTION_LANDSCAPES = {
    ((2, 8, 1024, 64), "fp16", True): ROOT / "templates/attention/landscapes/attention_2x8x1024x64-fp16-causal_h200.json",
    ((4, 8, 512, 64), "fp16", True): ROOT / "tests/data/attention_4x8x512x64-fp16-causal_h200.json",
}
GEMM_NAME, ATTENTION_NAME = "tuned_gemm_cpu_test", "tuned_attention_cpu_test"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """Both families tuned on replay into one database, exported (gemm through the command line),
    and imported."""
    folder = tmp_path_factory.mktemp("torch_export")
    db = f"sqlite:///{folder / 'tuner.db'}"
    for (shape, dtype, layout), landscape in GEMM_LANDSCAPES.items():
        tuner.tune("gemm", shape, dtype, {"layout": layout}, trials=6, replay=landscape, db=db, seed=1)
    for (shape, dtype, causal), landscape in ATTENTION_LANDSCAPES.items():
        tuner.tune("attention", shape, dtype, {"causal": causal}, trials=6, replay=landscape, db=db, seed=1)
    out = folder / "out"
    assert main(["export-torch", "gemm", "-o", str(out), "--db", db, "--name", GEMM_NAME]) == 0
    tuner.export_torch("attention", out_dir=out, db=db, name=ATTENTION_NAME)
    sys.path.insert(0, str(out))
    try:
        yield {"db": db, "out": out, "gemm": importlib.import_module(GEMM_NAME),
               "attention": importlib.import_module(ATTENTION_NAME)}
    finally:
        sys.path.remove(str(out))


def test_the_package_holds_each_winner_its_cubin_and_a_stamp(exported):
    db, gemm = exported["db"], exported["gemm"]
    folder = exported["out"] / GEMM_NAME
    table = json.loads((folder / "table.json").read_text())
    assert table["family"] == "gemm" and len(table["problems"]) == len(GEMM_LANDSCAPES)
    for row in table["problems"]:
        stored = tuner.best("gemm", row["shape"], row["dtype"], row["flags"], db=db)
        assert row["params"] == get_family("gemm").complete(stored.params) and row["use"] == "ours"
        assert row["limits"]["name"] == stored.device.name
        stem = folder / "kernels" / row["kernel"]
        assert stem.with_name(f"{row['kernel']}.cu").is_file()
        assert json.loads(stem.with_name(f"{row['kernel']}.launch.json").read_text())["params"] == stored.params
        assert stem.with_name(f"{row['kernel']}.cubin").read_bytes()[:4] == b"\x7fELF"
    stamp = gemm.STAMP
    assert stamp["gpu"] == "NVIDIA H100 80GB HBM3" and stamp["driver_version"] and stamp["cuda_version"]
    assert stamp["template_hash"] == get_family("gemm").template_hash
    assert stamp["cubins_compiled_with"].split()[0] in ("nvcc", "nvrtc") and stamp["arch"] == "sm_90a"
    assert stamp["written"][:4].isdigit()
    assert exported["attention"].STAMP["gpu"] == "NVIDIA H200"


def test_importing_registers_the_ops_with_their_fake_implementations(exported):
    gemm, attention = exported["gemm"], exported["attention"]
    a, b, bias = torch.randn(24, 40), torch.randn(40, 16), torch.randn(16)
    torch.library.opcheck(getattr(torch.ops, GEMM_NAME).gemm.default, (a, b, bias, "gelu"))
    torch.library.opcheck(getattr(torch.ops, GEMM_NAME).gemm.default, (a, b, bias, "gelu_tanh"))
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    torch.library.opcheck(getattr(torch.ops, ATTENTION_NAME).attention.default, (q, k, v, True))
    meta = gemm.gemm(torch.empty(300, 4096, dtype=torch.bfloat16, device="meta"),
                     torch.empty(14336, 4096, dtype=torch.bfloat16, device="meta").t())
    assert meta.shape == (300, 14336) and meta.dtype == torch.bfloat16 and meta.is_contiguous()
    out = attention.attention(*(torch.empty(2, 8, 999, 128, dtype=torch.float16, device="meta") for _ in range(3)))
    assert out.shape == (2, 8, 999, 128) and out.dtype == torch.float16


def test_on_cpu_tensors_the_vendors_path_gives_torchs_result(exported):
    gemm, attention = exported["gemm"], exported["attention"]
    torch.manual_seed(0)
    a, w, bias = torch.randn(33, 64), torch.randn(20, 64), torch.randn(20)
    torch.testing.assert_close(gemm.gemm(a, w.t()), a @ w.t())
    torch.testing.assert_close(gemm.gemm(a, w.t(), bias), a @ w.t() + bias)
    torch.testing.assert_close(gemm.gemm(a, w.t(), bias, epilogue="relu"), torch.relu(a @ w.t() + bias))
    torch.testing.assert_close(gemm.gemm(a.t().contiguous().t(), w.t(), bias, epilogue="gelu"),
                               F.gelu(a @ w.t() + bias))
    torch.testing.assert_close(gemm.gemm(a, w.t(), bias, epilogue="gelu_tanh"),
                               F.gelu(a @ w.t() + bias, approximate="tanh"))
    torch.testing.assert_close(gemm.gemm(a, w.t(), epilogue="gelu_tanh"), F.gelu(a @ w.t(), approximate="tanh"))
    torch.testing.assert_close(gemm.gemm(a, w.t(), epilogue="relu"), torch.relu(a @ w.t()))
    half = gemm.gemm(a.bfloat16(), w.t().bfloat16())
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half, (a.bfloat16() @ w.t().bfloat16()))
    q, k, v = (torch.randn(2, 4, 37, 64) for _ in range(3))
    for causal in (False, True):
        torch.testing.assert_close(attention.attention(q, k, v, causal=causal),
                                   F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    short = torch.randn(2, 4, 5, 64)  # k and v of another length: the vendor's path takes them
    torch.testing.assert_close(attention.attention(q, short, short), F.scaled_dot_product_attention(q, short, short))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_ops_trace_whole_under_torch_compile(exported, backend):
    gemm, attention = exported["gemm"], exported["attention"]
    torch._dynamo.reset()

    def layer(x, w, bias, q, k, v):
        h = gemm.gemm(x, w.t(), bias, epilogue="gelu")
        o = attention.attention(q, k, v, causal=True)
        return h.sum() + o.float().mean(), h, o

    compiled = torch.compile(layer, fullgraph=True, backend=backend)  # a graph break raises
    x, w, bias = torch.randn(16, 32), torch.randn(48, 32), torch.randn(48)
    q, k, v = (torch.randn(1, 2, 24, 64, dtype=torch.bfloat16) for _ in range(3))
    total, h, o = compiled(x, w, bias, q, k, v)
    assert h.shape == (16, 48) and h.dtype == torch.float32 and o.shape == (1, 2, 24, 64) and o.dtype == torch.bfloat16
    expected = layer(x, w, bias, q, k, v)
    torch.testing.assert_close(total, expected[0])
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    explained = torch._dynamo.explain(layer)(x, w, bias, q, k, v)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_a_tuned_shape_takes_its_winner_and_an_untuned_one_the_rules_pick(exported):
    gemm, attention, db = exported["gemm"], exported["attention"], exported["db"]
    meta = {"dtype": torch.bfloat16, "device": "meta"}
    tuned = gemm.gemm_choice(torch.empty(64, 14336, **meta), torch.empty(4096, 14336, **meta).t())
    stored = tuner.best("gemm", (64, 4096, 14336), "bf16", {"layout": "nt"}, db=db)
    assert (tuned.use, tuned.reason, tuned.source) == ("ours", "tuned", "64x4096x14336-bf16-epilogue=none-layout=nt")
    assert tuned.params == get_family("gemm").complete(stored.params)
    short = gemm.choose((64, 4096, 14336), "bf16", {"layout": "nt"})  # the epilogue left to its default
    assert (short.use, short.reason, short.kernel) == ("ours", "tuned", tuned.kernel)
    for shape, dtype, flags in [((300, 4096, 4096), "bf16", {"layout": "nt", "epilogue": "none"}),
                                ((1000, 2048, 2048), "fp16", {"layout": "nn", "epilogue": "none"}),
                                ((128, 256, 512), "fp16", {"layout": "tn", "epilogue": "bias_relu"})]:
        picked = gemm.choose(shape, dtype, flags)
        derived = tuner.best("gemm", shape, dtype, flags, db=db)
        assert picked.use == "ours" and picked.params == derived.params and picked.source == derived.source
        assert not derived.measured
    untuned = attention.attention_choice(*(torch.empty(3, 8, 700, 64, dtype=torch.float16, device="meta")
                                           for _ in range(3)), causal=True)
    derived = tuner.best("attention", (3, 8, 700, 64), "fp16", {"causal": True}, db=db)
    assert untuned.params == derived.params and untuned.source == derived.source
    kernel = rule_kernel(exported["attention"].TABLE, untuned)  # rendered for the shape; compiled on a GPU
    assert [(t.name, t.shape) for t in kernel.tensors] == [(n, (3, 8, 700, 64)) for n in "qkvo"]


def test_what_the_family_does_not_take_goes_to_the_vendors_path(exported):
    gemm, attention = exported["gemm"], exported["attention"]
    meta = {"device": "meta"}
    assert gemm.gemm_choice(torch.empty(8, 8, **meta), torch.empty(8, 8, **meta)).use == "vendor"  # fp32
    strided = torch.empty(64, 64, dtype=torch.float16, **meta)[:, ::2]
    assert "row-major" in gemm.gemm_choice(strided, torch.empty(32, 8, dtype=torch.float16, **meta)).reason
    shifted = torch.empty(64 * 64 + 1, dtype=torch.float16)[1:].view(64, 64)  # 2 bytes past an aligned start
    assert "16-byte" in gemm.gemm_choice(shifted, torch.empty(64, 64, dtype=torch.float16)).reason
    assert attention.choose((2, 8, 512, 80), "fp16", {"causal": False}).use == "vendor"  # head dim 80
    assert "does not take" in attention.choose((2, 8, 512, 80), "fp16", {"causal": False}).reason
    transposed = torch.empty(2, 512, 8, 64, dtype=torch.float16, **meta).transpose(1, 2)
    assert attention.attention_choice(transposed, transposed, transposed).use == "vendor"


def test_the_ops_epilogue_names_the_familys_flag(exported):
    """"gelu_tanh" after a bias is the family's bias_gelu_tanh: the rule's pick for it, as for
    bias_gelu, is the tuned winner of the same shape without an epilogue; without a bias, the
    vendor's path."""
    gemm = exported["gemm"]
    meta = {"dtype": torch.bfloat16, "device": "meta"}
    a, w, bias = torch.empty(64, 14336, **meta), torch.empty(4096, 14336, **meta), torch.empty(4096, **meta)
    for epilogue, flag in (("gelu_tanh", "bias_gelu_tanh"), ("gelu", "bias_gelu"), ("none", "bias")):
        choice = gemm.gemm_choice(a, w.t(), bias, epilogue)
        assert choice == gemm.choose((64, 4096, 14336), "bf16", {"layout": "nt", "epilogue": flag}), epilogue
        assert choice.key == f"64x4096x14336-bf16-epilogue={flag}-layout=nt", choice
        assert choice.use == "ours" and choice.source == "64x4096x14336-bf16-epilogue=none-layout=nt", choice
    unbiased = gemm.gemm_choice(a, w.t(), None, "gelu_tanh")
    assert unbiased.use == "vendor" and unbiased.reason == "the kernels apply gelu_tanh after a bias only"


def test_a_row_marked_vendor_takes_the_vendors_path(exported):
    gemm = exported["gemm"]
    path = exported["out"] / GEMM_NAME / "table.json"
    original = path.read_text()
    table = json.loads(original)
    table["problems"][0]["use"] = "vendor"
    path.write_text(json.dumps(table))
    try:
        gemm.load_table()
        row = table["problems"][0]
        assert gemm.choose(row["shape"], row["dtype"], row["flags"]).use == "vendor"
        other = table["problems"][1]
        assert gemm.choose(other["shape"], other["dtype"], other["flags"]).use == "ours"
    finally:
        path.write_text(original)
        gemm.load_table()
    assert gemm.choose(row["shape"], row["dtype"], row["flags"]).use == "ours"


def test_another_gpu_model_is_one_line_unless_the_vendors_path_is_chosen(exported, monkeypatch):
    gemm = exported["gemm"]
    assert gemm.check_gpu("NVIDIA H100 80GB HBM3") is True
    with pytest.raises(gemm.WrongGPU) as error:
        gemm.check_gpu("NVIDIA H200")
    assert "\n" not in str(error.value) and "NVIDIA H100 80GB HBM3" in str(error.value)
    monkeypatch.setattr(gemm, "fallback", "vendor")
    assert gemm.check_gpu("NVIDIA H200") is False


def test_changed_templates_refuse_the_rules_pick_in_one_line(exported, monkeypatch):
    attention = exported["attention"]
    monkeypatch.setitem(attention.TABLE, "stamp", dict(attention.TABLE["stamp"], template_hash="0" * 16))
    with pytest.raises(attention.ExportError) as error:
        attention.choose((5, 8, 300, 64), "fp16", {"causal": True})
    assert "\n" not in str(error.value) and "export it again" in str(error.value)
    monkeypatch.setattr(attention, "fallback", "vendor")
    assert attention.choose((5, 8, 301, 64), "fp16", {"causal": True}).use == "vendor"
    tuned = attention.choose((2, 8, 1024, 64), "fp16", {"causal": True})  # shipped as a cubin: unaffected
    assert tuned.use == "ours" and tuned.kernel


def test_bad_input_is_one_line(exported):
    gemm, attention = exported["gemm"], exported["attention"]
    a, b = torch.randn(4, 8), torch.randn(8, 6)
    cases = [
        (lambda: gemm.gemm(a, torch.randn(7, 6)), "a's columns must be b's rows"),
        (lambda: gemm.gemm(a[None], b), "2-D"),
        (lambda: gemm.gemm(a, b.half()), "share a dtype"),
        (lambda: gemm.gemm(a, b, torch.randn(5)), "bias must be a vector"),
        (lambda: gemm.gemm(a, b, epilogue="tanh"), "not one of none, relu, gelu, gelu_tanh"),
        (lambda: gemm.gemm(a, torch.empty(8, 6, device="meta")), "is on meta"),
        (lambda: attention.attention(*(torch.randn(2, 3, 4) for _ in range(3))), "4-D"),
        (lambda: attention.attention(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16)),
         "do not fit"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError) as error:
            call()
        assert words in str(error.value) and "\n" not in str(error.value)


def test_the_command_refuses_a_bad_name_and_a_folder_it_did_not_write(exported, tmp_path, capsys):
    assert main(["export-torch", "gemm", "-o", str(tmp_path), "--db", exported["db"], "--name", "not-a-name"]) == 2
    (tmp_path / "tuned_gemm").mkdir()
    (tmp_path / "tuned_gemm" / "mine.txt").write_text("keep")
    assert main(["export-torch", "gemm", "-o", str(tmp_path), "--db", exported["db"]]) == 2
    assert (tmp_path / "tuned_gemm" / "mine.txt").read_text() == "keep"
    err = capsys.readouterr().err
    assert "not a Python identifier" in err and "not an exported package" in err


def test_a_family_without_a_torch_op_is_refused_in_one_line(toy, exported, tmp_path, capsys):
    assert main(["export-torch", "toy", "-o", str(tmp_path), "--db", exported["db"]]) == 2
    err = capsys.readouterr().err
    assert "has no torch op" in err and err.count("\n") == 1
    assert not (tmp_path / "tuned_toy").exists()


def test_a_winner_that_does_not_compile_here_is_one_line_and_writes_nothing(exported, tmp_path, monkeypatch, capsys):
    import workers.compile
    from workers.errors import CompileError

    def refuse(request, **_):
        raise CompileError("nvrtc: error: no such toolkit\nthe whole log", log="the whole log")

    monkeypatch.setattr(workers.compile, "compile_cubin", refuse)
    assert main(["export-torch", "gemm", "-o", str(tmp_path), "--db", exported["db"]]) == 2
    err = capsys.readouterr().err
    assert "does not compile here: nvrtc: error: no such toolkit" in err and err.count("\n") == 1
    assert not (tmp_path / "tuned_gemm").exists()
