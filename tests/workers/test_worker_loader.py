"""workers.loader without a GPU: exports of both families read back (tensors, launch, compile
flags), unreadable exports refused in one line, and (where torch is installed) tensors of the
wrong shape, dtype, device or layout refused in one line before anything reaches the GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tuner
from deploy_tables import GEMM, TMA_WINNERS, store
from templates import get_family
from workers.loader import KernelArgumentError, LoadError, load


def export(tmp_path: Path, family: str, shape, dtype, flags, params) -> Path:
    """The winner ``params`` of one stored study, exported as `tuner export` writes it."""
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    store(db, family, shape, dtype, flags, [(get_family(family).complete(params), 0.1)])
    return tuner.export(family, shape, dtype, flags, out_dir=tmp_path / "out", db=db)


@pytest.fixture
def attention(tmp_path: Path) -> Path:
    shape, dtype, flags, params = TMA_WINNERS[0]  # TMA, persistent: tensor maps, a tile counter
    return export(tmp_path, "attention", shape, dtype, flags, params)


def test_an_attention_export_loads_with_its_tensors_launch_and_flags(attention: Path):
    kernel = load(attention)
    assert kernel.name == "attention_2x16x2048x128-bf16-causal"
    assert [(t.name, t.shape, t.dtype, t.output) for t in kernel.tensors] == [
        (name, (2, 16, 2048, 128), "bf16", name == "o") for name in ("q", "k", "v", "o")]
    assert kernel.arch == "sm_90a" and kernel.options == ("-O3", "-std=c++17")
    assert [a.kind for a in kernel.launch.args][:4] == ["tensormap"] * 4
    assert kernel.launch.workspace == (("tile_counter", 8),) and kernel.launch.blocks_per_sm_cap == 1
    assert kernel.launch.grid_on(132) == (132, 1, 1)  # 512 tiles, one block an SM
    assert kernel.source == attention.read_text()
    for other in (attention.with_suffix(""), attention.with_name(attention.stem + ".launch.json")):
        assert load(other).launch == kernel.launch


def test_a_gemm_export_names_its_operands_as_stored(tmp_path: Path):
    path = export(tmp_path, "gemm", (100, 64, 40), "fp16", {"layout": "nt", "epilogue": "bias_gelu"},
                  dict(GEMM, BLOCK_M=64, BLOCK_N=64, NUM_WARPS=4))
    kernel = load(path)
    assert [(t.name, t.shape, t.output) for t in kernel.tensors] == [
        ("a", (100, 40), False), ("b", (64, 40), False), ("bias", (64,), False), ("c", (100, 64), True)]
    assert {t.dtype for t in kernel.tensors} == {"fp16"}
    assert [a.value for a in kernel.launch.args] == ["a", "b", "bias", "c", 100, 64, 40]


def test_an_unreadable_export_is_one_line(tmp_path: Path, attention: Path):
    with pytest.raises(LoadError) as missing:
        load(tmp_path / "nothing.cu")
    assert str(missing.value) == f"cannot read the export {tmp_path / 'nothing.cu'}: No such file or directory"
    launch = attention.with_name(attention.stem + ".launch.json")
    document = json.loads(launch.read_text())
    del document["tensors"]  # an export written before the loader
    launch.write_text(json.dumps(document))
    with pytest.raises(LoadError) as old:
        load(attention)
    assert str(old.value) == (f"{launch} is not a kernel export of this tuner (no 'tensors'); "
                              "export it again with `tuner export`")
    launch.write_text("{not json")
    with pytest.raises(LoadError) as garbage:
        load(attention)
    assert "\n" not in str(garbage.value) and "is not a kernel export" in str(garbage.value)


def test_wrong_tensors_are_refused_in_one_line(attention: Path):
    torch = pytest.importorskip("torch")
    kernel = load(attention)
    q, k, v = (torch.zeros(2, 16, 2048, 128, dtype=torch.bfloat16) for _ in range(3))

    def refusal(*args, **kwargs) -> str:
        with pytest.raises(KernelArgumentError) as error:
            kernel(*args, **kwargs)
        assert "\n" not in str(error.value)
        return str(error.value)

    name = "attention_2x16x2048x128-bf16-causal"
    expected = f"{name}: q must be a contiguous bf16 CUDA tensor of shape [2, 16, 2048, 128]: "
    assert refusal(q[:, :, :1024], k, v) == expected + "got bfloat16 [2, 16, 1024, 128] on cpu"
    assert refusal(q.half(), k, v) == expected + "got float16 [2, 16, 2048, 128] on cpu"
    assert refusal(q, k, v) == expected + "got bfloat16 [2, 16, 2048, 128] on cpu"  # not on a GPU
    assert refusal(q, k) == f"{name}: missing input v (it takes q, k, v, o)"
    assert refusal(q, k, v, q, q) == f"{name}: 5 tensors given, it takes 4 (q, k, v, o)"
    assert refusal(q, k, v, out=q) == f"{name}: no tensor named 'out' (it takes q, k, v, o)"
    assert refusal(q, k, v, q=q) == f"{name}: tensor 'q' given twice"
    assert refusal("q", k, v) == expected + "got str"
