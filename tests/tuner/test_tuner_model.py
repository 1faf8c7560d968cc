"""tune-model: a transformer layer's problems from a Hugging Face config.json (the families'
``layer_problems``), its dry run as tune-many YAML, bad configs refused in one line, and a run on
the gemm landscape the family ships (real Ray, Optuna and SQLite)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess

import pytest
import yaml

import tuner
from templates.family import ModelShape
from tuner.cli.commands import main
from tuner.errors import UsageError
from tuner.lookup import family
from tuner.study import model
from tuner.study.many import read_problems

LLAMA_3_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
              "torch_dtype": "bfloat16", "vocab_size": 128256, "num_hidden_layers": 32}
# no GQA, head_dim from hidden / heads, biases on the attention's projections
MHA = {"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16,
       "torch_dtype": "float16", "attention_bias": True, "vocab_size": 32000}
LINEAR = "bf16-epilogue=none-layout=nt"


def write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config) if not isinstance(config, str) else config)
    return path


def cli(*argv, cwd):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as stop:  # argparse's refusals
            code = stop.code
    return subprocess.CompletedProcess(list(argv), code, out.getvalue(), err.getvalue())


def test_llama_3_8b_is_four_linear_projections_and_a_grouped_query_attention_a_token_count(tmp_path):
    shape = model.read_config(write(tmp_path, LLAMA_3_8B))
    assert shape == ModelShape(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, dtype="bf16")
    plan = model.plan_model(shape, (1, 64))
    assert [(p.family, p.problem.key, p.roles, p.tokens) for p in plan.problems] == [
        ("attention", "1x32x1x128x8-bf16-causal", ("attention",), 1),
        ("attention", "1x32x64x128x8-bf16-causal", ("attention",), 64),
        ("gemm", f"1x6144x4096-{LINEAR}", ("qkv",), 1), ("gemm", f"64x6144x4096-{LINEAR}", ("qkv",), 64),
        ("gemm", f"1x4096x4096-{LINEAR}", ("o",), 1), ("gemm", f"64x4096x4096-{LINEAR}", ("o",), 64),
        ("gemm", f"1x28672x4096-{LINEAR}", ("gate_up",), 1), ("gemm", f"64x28672x4096-{LINEAR}", ("gate_up",), 64),
        ("gemm", f"1x4096x14336-{LINEAR}", ("down",), 1), ("gemm", f"64x4096x14336-{LINEAR}", ("down",), 64)]
    # torch's Linear: activations row-major, the weight [out, in] transposed
    assert all(dict(p.problem.flags) == {"layout": "nt", "epilogue": "none"}
               for p in plan.problems if p.family == "gemm")
    assert plan.skipped == ()
    assert model.plan_model(shape).tokens == tuple(2**i for i in range(14))  # 1 ... 8192
    assert len(model.plan_model(shape).problems) == 5 * 14


def test_a_config_without_gqa_gets_its_attention_prefill_and_the_options_shape_the_linears(tmp_path):
    shape = model.read_config(write(tmp_path, MHA), lm_head=True, gate_up="separate")
    assert (shape.head_dim, shape.kv_heads, shape.dtype, shape.vocab) == (128, 16, "fp16", 32000)
    plan = model.plan_model(shape, (512,))
    assert plan.skipped == ()
    keys = {p.roles: (p.family, p.problem.key) for p in plan.problems}
    assert keys == {
        ("qkv",): ("gemm", "512x6144x2048-fp16-epilogue=bias-layout=nt"),
        ("o",): ("gemm", "512x2048x2048-fp16-epilogue=bias-layout=nt"),
        ("gate/up",): ("gemm", "512x5632x2048-fp16-epilogue=none-layout=nt"),
        ("down",): ("gemm", "512x2048x5632-fp16-epilogue=none-layout=nt"),
        ("lm_head",): ("gemm", "512x32000x2048-fp16-epilogue=none-layout=nt"),
        ("attention",): ("attention", "1x16x512x128-fp16-causal")}
    # a head dimension the attention family does not take: skipped with its reason
    odd = model.plan_model(ModelShape(1280, 4096, 16, 16, 80, "bf16"), (8,))
    assert [s.line for s in odd.skipped] == [
        "skipped attention 1x16x8x80-bf16-causal (attention, 8 tokens): unsupported head dimension D=80: "
        "attention supports [64, 96, 128, 256]"]


def test_the_dry_run_prints_tune_many_yaml_and_stores_nothing(tmp_path):
    config = write(tmp_path, MHA)
    done = cli("tune-model", str(config), "--tokens", "16,256", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    documents = list(yaml.safe_load_all(done.stdout))  # the header of comments is no document
    heads = [line for line in done.stdout.splitlines() if line.startswith("# tuner tune-many")]
    assert heads == ["# tuner tune-many attention --shapes FILE", "# tuner tune-many gemm --shapes FILE"]
    assert len(documents) == 2
    plan = model.plan_model(model.read_config(config), (16, 256))
    for head, entries in zip(heads, documents):
        name = head.split()[3]
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(entries))
        assert read_problems(family(name), tmp_path / f"{name}.yaml") == [
            p.problem for p in plan.problems if p.family == name]
    assert "# qkv, 16 tokens" in done.stdout
    assert not (tmp_path / "tuner.db").exists()
    gqa = cli("tune-model", str(write(tmp_path, LLAMA_3_8B, "llama.json")), "--tokens", "1", "--dry-run",
              cwd=tmp_path)
    assert '- {shape: "1,32,1,128,8", dtype: bf16, flags: {causal: true}}  # attention, 1 token' in gqa.stdout


@pytest.mark.parametrize("config, extra, line", [
    ({k: v for k, v in LLAMA_3_8B.items() if k != "hidden_size"}, (), ": no hidden_size"),
    ({**LLAMA_3_8B, "intermediate_size": 14336.5}, (), "intermediate_size must be a whole number, not 14336.5"),
    ({**LLAMA_3_8B, "num_attention_heads": "32"}, (), "num_attention_heads must be a whole number, not '32'"),
    ({**LLAMA_3_8B, "head_dim": -128}, (), "head_dim must be at least 1, not -128"),
    ({**LLAMA_3_8B, "num_key_value_heads": 6}, (), "num_key_value_heads (6) does not divide num_attention_heads (32)"),
    ({**LLAMA_3_8B, "torch_dtype": "float32"}, (), "torch_dtype 'float32' is not one the kernels take"),
    ({k: v for k, v in LLAMA_3_8B.items() if k != "torch_dtype"}, (), ": no torch_dtype"),
    ({k: v for k, v in LLAMA_3_8B.items() if k != "vocab_size"}, ("--lm-head",), ": no vocab_size"),
    ({**MHA, "attention_bias": "yes"}, (), "attention_bias must be true or false, not 'yes'"),
    ({**MHA, "hidden_size": 2050}, (), "no head_dim, and hidden_size (2050) is not a multiple of num_attention_heads (16)"),
    ("{not json", (), "is not a JSON config"),
    (LLAMA_3_8B, ("--tokens", "1,-4"), "argument --tokens: each count must be at least 1, not -4"),
    (LLAMA_3_8B, ("--tokens", "1,2.5"), "argument --tokens: not a whole number: '2.5'"),
    (LLAMA_3_8B, ("--dtype", "fp8"), "argument --dtype: invalid choice: 'fp8'"),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_bad_config_or_argument_is_one_line_exit_2_and_nothing_stored(tmp_path, config, extra, line, dry_run):
    path = write(tmp_path, config)
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    done = cli("tune-model", str(path), *extra, *(["--dry-run"] if dry_run else ["--trials", "2"]), "--db", db,
               cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("tuner: error: ")
    assert line in done.stderr
    assert not (tmp_path / "tuner.db").exists()


def test_the_dtype_argument_replaces_the_configs_and_a_config_may_nest_the_text_model(tmp_path):
    nested = {"architectures": ["LlavaForConditionalGeneration"], "torch_dtype": "float32",
              "text_config": {k: v for k, v in LLAMA_3_8B.items() if k != "torch_dtype"}}
    shape = model.read_config(write(tmp_path, nested), dtype="fp16")
    assert (shape.hidden, shape.kv_heads, shape.dtype) == (4096, 8, "fp16")
    with pytest.raises(UsageError, match="torch_dtype 'float32'"):
        model.read_config(write(tmp_path, nested))
    assert model.parse_tokens("64, 1,64") == (64, 1)


def test_tune_model_tunes_what_a_landscape_records_through_tune_many_and_resumes(tmp_path, module_ray):
    """Llama-3-8B at 64 tokens: its down projection is the landscape gemm ships; the other
    projections and its grouped-query attention have none (skipped, a line each)."""
    config = write(tmp_path, LLAMA_3_8B)
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    args = ("tune-model", str(config), "--tokens", "64", "--trials", "3", "--retime", "0", "--seed", "1",
            "--replay", "gemm_64x4096x14336-bf16-nt_h100", "--db", db)
    done = cli(*args, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    [tuned] = summary["problems"]
    assert (tuned["family"], tuned["problem"], tuned["roles"], tuned["tokens"]) == (
        "gemm", f"64x4096x14336-{LINEAR}", ["down"], 64)
    assert tuned["result"]["status"] == "finished" and tuned["result"]["measured"] == 3
    assert [(s["role"], s["reason"].split(" (")[0]) for s in summary["skipped"]] == [
        ("attention", "no landscape given records it"), ("qkv", "no landscape given records it"),
        ("o", "no landscape given records it"), ("gate_up", "no landscape given records it")]
    assert "problem 1/1 64x4096x14336" in done.stderr
    assert "skipped gemm 64x6144x4096-bf16-epilogue=none-layout=nt (qkv, 64 tokens)" in done.stderr
    [study] = tuner.studies(db=db)
    assert (study.shape, study.n_trials, study.replay) == ((64, 4096, 14336), 3, True)
    again = cli(*args, cwd=tmp_path)  # the summary table; the study is at its budget
    assert again.returncode == 0, again.stderr[-3000:]
    rows = again.stdout.splitlines()
    assert rows[0].split() == ["family", "problem", "for", "status", "trials", "time", "best"]
    assert rows[1].split()[:7] == ["gemm", f"64x4096x14336-{LINEAR}", "down", "@", "64", "skipped", "3"]
    assert rows[1].endswith("TFLOPS") and len(rows) == 6
    assert [s.n_trials for s in tuner.studies(db=db)] == [3]
