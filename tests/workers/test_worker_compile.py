from __future__ import annotations

import shutil

import pytest

import workers.compile as compile_mod
from workers.compile import compile_cubin, parse_ptxas, toolkit_version
from workers.errors import CompileError
from workers.results import CompileRequest

KERNEL = r'''
extern "C" __global__ void scale(float* y, const float* x, float a, int n) {
  __shared__ float s[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? x[i] : 0.f;
  __syncthreads();
  if (i < n) y[i] = a * s[threadIdx.x];
}
'''
BACKENDS = [pytest.param("nvcc", marks=pytest.mark.skipif(not shutil.which("nvcc"), reason="no nvcc")),
            "nvrtc"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiles_for_sm90a_with_resources(backend):
    binary = compile_cubin(CompileRequest(KERNEL, "scale", ("-O3",)), backend=backend)
    assert binary.cubin[:4] == b"\x7fELF"
    assert binary.resources is not None and binary.resources.registers > 0
    assert binary.resources.smem_static == 1024
    assert binary.toolkit == toolkit_version(backend) and binary.toolkit.startswith(backend)
    assert len(binary.cubin_hash) == 64 and binary.compile_seconds > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_hit_does_not_recompile(backend, tmp_path, monkeypatch):
    calls = []
    name = "_run_nvcc" if backend == "nvcc" else "_run_nvrtc"
    real = getattr(compile_mod, name)
    monkeypatch.setattr(compile_mod, name, lambda *a: calls.append(1) or real(*a))
    request = CompileRequest(KERNEL, "scale", ("-O3",))
    first = compile_cubin(request, backend=backend, cache_dir=tmp_path)
    second = compile_cubin(request, backend=backend, cache_dir=tmp_path)
    assert calls == [1]
    assert second == first


@pytest.mark.parametrize("backend", BACKENDS)
def test_syntax_error_raises_with_log(backend):
    with pytest.raises(CompileError) as info:
        compile_cubin(CompileRequest(KERNEL.replace("s[threadIdx.x];", "s[threadIdx.x]"), "scale", ()),
                      backend=backend)
    assert "\n" not in str(info.value)
    assert "error" in info.value.log.lower()


def test_options_change_the_source_hash():
    a = compile_cubin(CompileRequest(KERNEL, "scale", ("-O3",)), backend="nvrtc")
    b = compile_cubin(CompileRequest(KERNEL, "scale", ("-O3", "--use_fast_math")), backend="nvrtc")
    assert a.source_hash != b.source_hash


@pytest.mark.skipif(not shutil.which("nvcc"), reason="no nvcc")
def test_timeout_is_a_compile_error():
    with pytest.raises(CompileError, match="timed out"):
        compile_cubin(CompileRequest(KERNEL, "scale", ()), backend="nvcc", timeout_s=0.01)


def test_parse_ptxas_picks_the_kernel():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5otherPf' for 'sm_90a'
ptxas info    : Function properties for _Z5otherPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compiling entry function 'attn_fwd' for 'sm_90a'
ptxas info    : Function properties for attn_fwd
    96 bytes stack frame, 40 bytes spill stores, 44 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16384 bytes smem, 400 bytes cmem[0]
"""
    r = parse_ptxas(log, "attn_fwd")
    assert (r.registers, r.smem_static, r.stack_bytes, r.spill_stores, r.spill_loads) == (255, 16384, 96, 40, 44)
    assert parse_ptxas(log, "other").registers == 8
    assert parse_ptxas("nothing", "x") is None


def test_unknown_backend():
    with pytest.raises(CompileError, match="unknown compiler backend"):
        compile_cubin(CompileRequest(KERNEL, "scale", ()), backend="clang")


def test_a_toolkit_newer_than_the_driver_is_refused():
    from workers.compile import check_toolkit_for_driver

    check_toolkit_for_driver("nvcc 13.0.88", "13.0")
    check_toolkit_for_driver("nvrtc 12.8", "13.0")
    with pytest.raises(CompileError, match="newer than the GPU driver's CUDA 13.0"):
        check_toolkit_for_driver("nvcc 13.4.1", "13.0")


def test_cubins_are_cached_under_the_user_cache_by_default(monkeypatch, tmp_path):
    from workers.compile import default_cache_dir

    monkeypatch.delenv("TUNER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "kernel-tuner" / "cubins"
    monkeypatch.setenv("TUNER_CACHE", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


@pytest.mark.skipif(not shutil.which("nvcc"), reason="no nvcc")
def test_nvrtc_and_nvcc_emit_the_same_code_and_name_the_same_release():
    """The pool compiles with NVRTC (``auto``) where it loads: the same ptxas as nvcc, so
    the cubins differ only in the note that names the compiler and its command line."""
    request = CompileRequest(KERNEL, "scale", ("-O3",))
    by_nvcc, by_nvrtc = (compile_cubin(request, backend=b) for b in ("nvcc", "nvrtc"))
    assert len(by_nvcc.cubin) == len(by_nvrtc.cubin) and by_nvcc.resources == by_nvrtc.resources
    differ = [i for i, (a, b) in enumerate(zip(by_nvcc.cubin, by_nvrtc.cubin)) if a != b]
    note = by_nvcc.cubin.find(b"ptxas\x00Cuda compilation tools")
    assert differ and note > 0 and note - 16 <= differ[0] and differ[-1] < note + 200  # its header too
    assert toolkit_version("nvcc").split()[1] == toolkit_version("nvrtc").split()[1]  # 13.0.88


def test_backend_choice(monkeypatch):
    monkeypatch.delenv("TUNER_COMPILER", raising=False)
    assert compile_mod.resolve_backend("auto") == "nvrtc"  # its library loads here
    monkeypatch.setenv("TUNER_COMPILER", "nvcc")
    assert compile_mod.resolve_backend("auto") == "nvcc"
    assert compile_mod.resolve_backend("nvrtc") == "nvrtc"  # an explicit choice stands
    monkeypatch.setenv("TUNER_COMPILER", "gcc")
    with pytest.raises(CompileError, match="TUNER_COMPILER='gcc' is not one of"):
        compile_mod.resolve_backend("auto")


def test_the_screen_reads_registers_and_shared_memory_against_the_device():
    from templates.family import H100_LIMITS, Launch
    from workers.compile_task import screen
    from workers.results import Binary, Resources

    def binary(registers, smem_static=0, spills=0):
        return Binary(b"", "k", Resources(registers, smem_static, 0, spills, spills), "s", "c", "t", (), 0.1)

    def launch(threads, smem=0):
        return Launch("k", (1, 1, 1), (threads, 1, 1), smem, ())

    assert screen(binary(128), 256, launch(512), H100_LIMITS) is None  # 128 x 512 = 65536: fits
    assert "registers a block" in screen(binary(129), 256, launch(512), H100_LIMITS)  # 136 allocated
    assert screen(binary(64, 16 * 1024), 256, launch(128, 200 * 1024), H100_LIMITS) is None
    assert "shared memory" in screen(binary(64, 32 * 1024), 256, launch(128, 200 * 1024), H100_LIMITS)
    assert "spills" in screen(binary(64, spills=512), 256, launch(128), H100_LIMITS)
    assert screen(binary(255), 256) is None  # no launch, no device: spills only


def test_nvrtc_writes_only_into_mutable_buffers(monkeypatch):
    """NVRTC fills the buffers it is given. Given ``b" " * size`` it wrote, where the log was
    empty (size 1), into the interpreter's shared one-byte b" ": every space encoded later in
    the process read NUL, and torch's import failed."""
    from cuda.bindings import nvrtc

    given = []
    for name in ("nvrtcGetProgramLog", "nvrtcGetCUBIN"):
        real = getattr(nvrtc, name)

        def spy(prog, buffer, real=real):
            given.append(memoryview(buffer).readonly)
            return real(prog, buffer)

        monkeypatch.setattr(nvrtc, name, spy)
    binary = compile_cubin(CompileRequest(KERNEL, "scale", ()), backend="nvrtc")
    assert given == [False, False] and binary.cubin[:4] == b"\x7fELF"


def test_nvrtc_is_asked_not_to_cache_so_ptxas_reports_every_compile():
    """NVRTC 12.9+ caches compiles on disk; a hit skips ptxas and leaves the log without the
    registers and spills the screen reads (seen on the GPU machine)."""
    options = compile_mod._nvrtc_options(CompileRequest(KERNEL, "scale", ("-O3",)))
    assert b"--no-cache" in options and b"-Xptxas=-v" in options and b"-O3" not in options
    assert compile_mod._release_at_least("13.0", (12, 9)) and not compile_mod._release_at_least("12.8", (12, 9))


@pytest.mark.parametrize("metadata", ['[1, 2]', '{"cubin_hash": 7}', '"text"', '{"kernel": "scale"}',
                                      '{"resources": {"registers": "x"}}'])
def test_a_cache_entry_of_the_wrong_structure_is_a_miss_and_is_rewritten(metadata, tmp_path, monkeypatch,
                                                                           caplog):
    """JSON that parses but is not an entry: a warning, a recompile, and the entry written anew."""
    compiled = []
    monkeypatch.setattr(compile_mod, "resolve_backend", lambda backend="auto": "nvrtc")
    monkeypatch.setattr(compile_mod, "toolkit_version", lambda backend="auto": "nvrtc 13.0.0")
    monkeypatch.setattr(compile_mod, "_run_nvrtc", lambda *a: compiled.append(1) or (b"\x7fELF cubin", ""))
    monkeypatch.setattr(compile_mod, "_cuobjdump_resources", lambda *a: None)
    request = CompileRequest(KERNEL, "scale", ("-O3",))
    first = compile_cubin(request, cache_dir=tmp_path)
    meta = tmp_path / f"{first.source_hash}.json"
    if metadata.startswith("{") and "cubin_hash\": 7" not in metadata:  # right type, wrong fields
        metadata = metadata[:-1] + f', "cubin_hash": "{first.cubin_hash}"}}'
    meta.write_text(metadata)
    with caplog.at_level("WARNING", logger="workers"):
        again = compile_cubin(request, cache_dir=tmp_path)
    assert compiled == [1, 1] and again.cubin == first.cubin
    assert any("compile cache entry" in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records)
    assert compile_cubin(request, cache_dir=tmp_path) == again and compiled == [1, 1]  # healed: a hit


@pytest.mark.skipif(not shutil.which("nvcc"), reason="no nvcc")
def test_compile_all_fills_the_cache_in_spawned_processes_and_reports_each_failure(tmp_path, monkeypatch):
    from workers.compile import compile_all

    monkeypatch.setenv("TUNER_CACHE", str(tmp_path))
    good = CompileRequest('extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.f; }', "k", ("-O3",))
    bad = CompileRequest('extern "C" __global__ void k( { }', "k", ("-O3",))
    errors = compile_all([good, bad, good], processes=2)  # the same request twice: compiled once
    assert len(errors) == 1 and errors[0].startswith("k: ")
    cached = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert cached  # the good one is in the workers' cache: compiling it again reads it back
    assert compile_cubin(good, cache_dir=tmp_path).cubin[:4] == b"\x7fELF"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == cached


def test_the_compile_task_renders_the_config_it_is_given(tmp_path):
    """Given the family, the problem and the params (the coordinator renders nothing), the task
    renders the source and compiles it: the same cubin as a source rendered beforehand; a config
    the template cannot render comes back as a "render: ..." failure, not an exception."""
    from templates import get_family
    from templates.family import H100_LIMITS
    from workers.compile_task import CompileFailure, compile_task

    fam = get_family("attention")
    problem = fam.parse_problem("1,2,128,64", "fp16", {})
    params = fam.valid_configs(problem, H100_LIMITS)[0]
    launch = fam.launch(params, problem)
    options = tuple(fam.compile_options(params, problem))
    rendered = compile_task(CompileRequest("", launch.kernel, options), "nvrtc", str(tmp_path), 300,
                            "attention", problem, params)
    given = compile_task(CompileRequest(fam.render(params, problem), launch.kernel, options), "nvrtc",
                         None, 300)
    assert not isinstance(rendered, CompileFailure), rendered
    assert rendered.cubin_hash == given.cubin_hash and rendered.source_hash == given.source_hash
    broken = compile_task(CompileRequest("", launch.kernel, options), "nvrtc", None, 300, "attention",
                          problem, {**params, "BLOCK_N": 48})
    assert isinstance(broken, CompileFailure) and broken.reason.startswith("render: ")
