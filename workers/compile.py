"""CUDA source -> cubin, with nvcc or NVRTC, cached on disk by what went in::

    from workers.compile import compile_cubin
    from workers.results import CompileRequest

    request = CompileRequest(source, kernel="scale", options=("-O3",))
    binary = compile_cubin(request, cache_dir=Path("~/.cache/tuner").expanduser())
    binary.resources.registers, binary.cubin_hash

The cache key is sha256(source, kernel, options, arch, toolkit version), so a new toolkit
never answers with an old binary. The resources come from ptxas' ``-v`` report.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from workers.errors import CompileError
from workers.results import Binary, CompileRequest, Resources

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "nvcc", "nvrtc")
DEFAULT_TIMEOUT_S = 300.0


# -- toolkit -----------------------------------------------------------------------------------
def resolve_backend(backend: str = "auto") -> str:
    """``nvcc`` or ``nvrtc``; ``$TUNER_COMPILER``, where set, stands in for ``auto``.

    ``auto``: NVRTC where its library loads, else nvcc. Both run the same ptxas: 64 attention
    configs compiled by nvcc 13.0.88 and NVRTC 13.0.88 gave the same SASS (the cubins differ in
    the note naming the compiler), and 16 processes compiled 27-36 configs a second with NVRTC,
    17-20 with nvcc, over five runs on the H200 machine (it skips the host preprocessor and
    three processes). Until NVRTC was given mutable buffers (:func:`_nvrtc_compile`), a process
    that compiled with it could not import torch afterwards, and ``auto`` was nvcc."""
    if backend == "auto" and os.environ.get("TUNER_COMPILER"):
        backend = os.environ["TUNER_COMPILER"]
        if backend not in BACKENDS:
            raise CompileError(f"TUNER_COMPILER={backend!r} is not one of {', '.join(BACKENDS)}")
    if backend not in BACKENDS:
        raise CompileError(f"unknown compiler backend {backend!r} (one of {', '.join(BACKENDS)})")
    if backend == "auto":
        return "nvrtc" if _nvrtc_loads() else "nvcc"
    return backend


@functools.lru_cache(maxsize=None)
def _nvrtc_loads() -> bool:
    try:
        _nvrtc_release()
    except CompileError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _nvcc_version() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise CompileError("nvcc not found on PATH")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"V(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    return f"nvcc {match.group(1) if match else out.strip().splitlines()[-1]}"


@functools.lru_cache(maxsize=None)
def _nvrtc_release() -> str:
    """``13.0``: NVRTC's own version call, which compiles nothing."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise CompileError(f"NVRTC is not available: {exc}") from exc
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings load the library on first use
        raise CompileError(f"NVRTC is not available: {exc}") from exc
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"nvrtcVersion failed: {err.name}")
    return f"{major}.{minor}"


@functools.lru_cache(maxsize=None)
def _nvrtc_version() -> str:
    """``nvrtc 13.0.88``: the ptxas release noted in the cubin of an empty kernel (the version
    call gives only 13.0), so that cache keys and stored trials name the exact compiler."""
    release = _nvrtc_release()
    probe = CompileRequest('extern "C" __global__ void probe() {}', "probe", (), arch="sm_80")
    try:
        cubin, _ = _nvrtc_compile(probe)
    except CompileError:
        return f"nvrtc {release}"
    found = re.search(rb"V(\d+\.\d+\.\d+)", cubin)
    return f"nvrtc {found.group(1).decode() if found else release}"


def toolkit_version(backend: str = "auto") -> str:
    """``"nvcc 13.0.88"`` or ``"nvrtc 13.0.88"``; read once per process (NVRTC's compiles an
    empty kernel)."""
    return _nvcc_version() if resolve_backend(backend) == "nvcc" else _nvrtc_version()


def toolkit_release(backend: str = "auto") -> str:
    """``"nvcc 13.0.88"`` or ``"nvrtc 13.0"``, without compiling anything: enough to compare
    with the driver's CUDA version."""
    return _nvcc_version() if resolve_backend(backend) == "nvcc" else f"nvrtc {_nvrtc_release()}"


def default_cache_dir() -> Path:
    """``$TUNER_CACHE``, else ``$XDG_CACHE_HOME/kernel-tuner/cubins`` (``~/.cache/...``)."""
    if os.environ.get("TUNER_CACHE"):
        return Path(os.environ["TUNER_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kernel-tuner" / "cubins"


def check_toolkit_for_driver(toolkit: str, driver_cuda: str) -> None:
    """Refuse a compiler newer than the driver's CUDA: its cubins may not load there."""
    found = re.search(r"(\d+)\.(\d+)", toolkit)
    have = re.search(r"(\d+)\.(\d+)", driver_cuda)
    if found and have and tuple(map(int, found.groups())) > tuple(map(int, have.groups())):
        raise CompileError(f"the toolkit ({toolkit}) is newer than the GPU driver's CUDA "
                           f"{driver_cuda}; install a toolkit no newer than the driver")


# -- ptxas' report ----------------------------------------------------------------------------
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")


def parse_ptxas(log: str, kernel: str) -> Resources | None:
    """Resources of ``kernel`` (or of the only entry function) from a ``ptxas -v`` report."""
    starts = list(_ENTRY.finditer(log))
    if not starts:
        return None
    blocks = {}
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(log)
        blocks[match.group(1)] = log[match.start() : end]
    name = kernel if kernel in blocks else None
    if name is None:
        near = [n for n in blocks if kernel in n]  # a C++-mangled name holds the plain one
        name = near[0] if len(near) == 1 else (next(iter(blocks)) if len(blocks) == 1 else None)
    if name is None:
        return None
    block = blocks[name]

    def number(pattern: str) -> int:
        found = re.search(pattern, block)
        return int(found.group(1)) if found else 0

    registers = re.search(r"Used (\d+) registers", block)
    if registers is None:
        return None
    return Resources(
        registers=int(registers.group(1)),
        smem_static=number(r"(\d+) bytes smem"),
        stack_bytes=number(r"(\d+) bytes stack frame"),
        spill_stores=number(r"(\d+) bytes spill stores"),
        spill_loads=number(r"(\d+) bytes spill loads"),
    )


_ADVISORY = re.compile(r"ptxas info\s*:\s*\((C75\d\d)\)\s*(.*)")


def ptxas_advisories(log: str) -> tuple[str, ...]:
    """ptxas' notes that it cut a kernel's wgmma pipeline (Hopper, codes C75xx), one line each as
    ``C7514: ...``: registers of an unfinished wgmma read early, so that ptxas injected a wait
    (C7517) or an arrive (C7519), or serialized every wgmma of the kernel (C7514, a large loss)."""
    seen: dict[str, None] = {}
    for match in _ADVISORY.finditer(log):
        seen[f"{match.group(1)}: {' '.join(match.group(2).split())}"] = None
    return tuple(seen)


def binary_tags(binary: Binary, resources: Resources | None = None) -> dict[str, Any]:
    """What a measurement carries of the binary it timed: its hash, toolkit, compile time, the
    compile report's resources (``resources`` where the report had none) and ptxas' notes."""
    return {"resources": binary.resources or resources, "cubin_hash": binary.cubin_hash,
            "toolkit": binary.toolkit, "compile_seconds": binary.compile_seconds,
            "advisories": ptxas_advisories(binary.log)}


def _cuobjdump_resources(cubin: bytes, kernel: str) -> Resources | None:
    tool = shutil.which("cuobjdump")
    if tool is None:
        return None
    with tempfile.TemporaryDirectory(prefix="tuner-cuobjdump-") as tmp:
        path = Path(tmp, "kernel.cubin")
        path.write_bytes(cubin)
        try:
            out = subprocess.run(
                [tool, "--dump-resource-usage", str(path)], capture_output=True, text=True, timeout=60
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    found: dict[str, Resources] = {}
    current = None
    for line in out.splitlines():
        header = re.match(r"\s*Function (\S+):", line)
        if header:
            current = header.group(1)
            continue
        fields = dict(re.findall(r"(\w+):(\d+)", line))
        if current and "REG" in fields:
            found[current] = Resources(
                registers=int(fields["REG"]),
                smem_static=int(fields.get("SHARED", 0)),
                stack_bytes=int(fields.get("STACK", 0)),
                spill_stores=0,  # cuobjdump does not report spills
                spill_loads=0,
            )
    if kernel in found:
        return found[kernel]
    near = [r for name, r in found.items() if kernel in name]
    return near[0] if len(near) == 1 else None


# -- the backends -----------------------------------------------------------------------------
def _compute_arch(arch: str) -> str:
    return arch.replace("sm_", "compute_", 1)


def _run_nvcc(request: CompileRequest, timeout_s: float) -> tuple[bytes, str]:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise CompileError("nvcc not found on PATH")
    with tempfile.TemporaryDirectory(prefix="tuner-nvcc-") as tmp:
        src, out = Path(tmp, "kernel.cu"), Path(tmp, "kernel.cubin")
        src.write_text(request.source)
        gencode = f"arch={_compute_arch(request.arch)},code={request.arch}"
        cmd = [nvcc, "-cubin", "-gencode", gencode, "-Xptxas", "-v", *request.options]
        cmd += ["-o", str(out), str(src)]
        proc = subprocess.Popen(
            cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # so a timeout kills cicc and ptxas too
        )
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
            raise CompileError(f"nvcc timed out after {timeout_s:g} s", log or "") from None
        if proc.returncode != 0 or not out.exists():
            raise CompileError(f"nvcc failed (exit {proc.returncode}): {_first_error(log)}", log)
        return out.read_bytes(), log


def _nvrtc_options(request: CompileRequest) -> list[bytes]:
    opts = [f"--gpu-architecture={request.arch}", "-Xptxas=-v"]
    if _release_at_least(_nvrtc_release(), (12, 9)):
        # NVRTC 12.9+ keeps its own cache of compiles (~/.nv/ComputeCache); a hit skips ptxas and
        # leaves the log empty: registers then came from cuobjdump and the spills, which only
        # ptxas reports, read 0. Ours is the cache (by source, options and toolkit).
        opts.append("--no-cache")
    for option in request.options:
        if re.fullmatch(r"-O\d", option):  # NVRTC optimises by default and rejects -O3
            continue
        opts.append(option)
    for include in _cuda_include_dirs():
        opts.append(f"--include-path={include}")
    return [o.encode() for o in opts]


def _release_at_least(release: str, version: tuple[int, int]) -> bool:
    """Whether ``release`` ("13.0") is ``version`` or later."""
    major, minor = (int(part) for part in release.split(".")[:2])
    return (major, minor) >= version


@functools.lru_cache(maxsize=None)
def _cuda_include_dirs() -> tuple[str, ...]:
    found = []
    candidates = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    for root in candidates:
        include = Path(root, "include") if root else None
        if include and (include / "cuda_fp16.h").exists() and str(include) not in found:
            found.append(str(include))
    return tuple(found[:1])


def _nvrtc_compile(request: CompileRequest) -> tuple[bytes, str]:
    from cuda.bindings import nvrtc

    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(request.source.encode(), b"kernel.cu", 0, [], [])
    if err != ok:
        raise CompileError(f"nvrtcCreateProgram failed: {err.name}")
    try:
        opts = _nvrtc_options(request)
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        # NVRTC writes into the buffers it is given: they must be mutable. Into ``b" " * size``
        # it wrote the interpreter's shared one-byte b" " where the log was empty (size 1):
        # every later space encoded in the process read NUL, and torch's import failed.
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = bytes(buf).rstrip(b"\x00 ").decode(errors="replace")
        if result != ok:
            raise CompileError(f"nvrtc failed ({result.name}): {_first_error(log)}", log)
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = bytearray(size)
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        if err != ok or size == 0:
            raise CompileError(f"nvrtcGetCUBIN failed: {err.name}", log)
        return bytes(cubin), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _run_nvrtc(request: CompileRequest, timeout_s: float) -> tuple[bytes, str]:
    """NVRTC runs in this process; a thread enforces the deadline (the pool kills the task)."""
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["result"] = _nvrtc_compile(request)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=work, name="nvrtc", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise CompileError(f"nvrtc timed out after {timeout_s:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]


def _first_error(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for line in lines:
        if "error" in line.lower():
            return line[:300]
    return lines[0][:300] if lines else "no output"


# -- the entry point ---------------------------------------------------------------------------
def source_hash(request: CompileRequest, toolkit: str) -> str:
    key = [request.source, request.kernel, list(request.options), request.arch, toolkit]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()


def compile_cubin(
    request: CompileRequest,
    *,
    backend: str = "auto",
    cache_dir: Path | str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Binary:
    """Compile ``request`` to a cubin for ``request.arch``; raise CompileError with the log."""
    chosen = resolve_backend(backend)
    toolkit = toolkit_version(chosen)
    key = source_hash(request, toolkit)
    cache = Path(cache_dir) if cache_dir is not None else None
    if cache is not None:
        hit = _cache_read(cache, key)
        if hit is not None:
            logger.debug("compile cache hit %s", key[:12])
            return hit
    start = time.perf_counter()
    run = _run_nvcc if chosen == "nvcc" else _run_nvrtc
    cubin, log = run(request, timeout_s)
    seconds = time.perf_counter() - start
    resources = parse_ptxas(log, request.kernel) or _cuobjdump_resources(cubin, request.kernel)
    binary = Binary(
        cubin=cubin,
        kernel=request.kernel,
        resources=resources,
        source_hash=key,
        cubin_hash=hashlib.sha256(cubin).hexdigest(),
        toolkit=toolkit,
        options=tuple(request.options),
        compile_seconds=seconds,
        log=log,
    )
    if cache is not None:
        _cache_write(cache, binary)
    return binary


def _cache_read(cache: Path, key: str) -> Binary | None:
    """The cached binary of ``key``, or None (a miss). An entry that does not read back as one
    (a cubin whose hash is not the recorded one, metadata of another structure) is removed with
    a warning, so that the compile that follows writes it anew."""
    meta, blob = cache / f"{key}.json", cache / f"{key}.cubin"
    try:
        data = json.loads(meta.read_text())
        cubin = blob.read_bytes()
    except (OSError, ValueError):
        return None
    try:
        if hashlib.sha256(cubin).hexdigest() != data["cubin_hash"]:
            raise ValueError("the cubin's hash is not the recorded one")
        return Binary(
            cubin=cubin,
            kernel=str(data["kernel"]),
            resources=Resources.from_json(data["resources"]) if data.get("resources") else None,
            source_hash=key,
            cubin_hash=data["cubin_hash"],
            toolkit=str(data["toolkit"]),
            options=tuple(str(o) for o in data["options"]),
            compile_seconds=float(data["compile_seconds"]),
            log=str(data.get("log") or ""),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        logger.warning("compile cache entry %s is corrupt (%s); recompiling", key[:12], exc)
        for path in (meta, blob):
            path.unlink(missing_ok=True)
        return None


def _cache_write(cache: Path, binary: Binary) -> None:
    data = {
        "kernel": binary.kernel,
        "resources": binary.resources.to_json() if binary.resources else None,
        "cubin_hash": binary.cubin_hash,
        "toolkit": binary.toolkit,
        "options": list(binary.options),
        "compile_seconds": binary.compile_seconds,
        "log": binary.log,
    }
    try:
        cache.mkdir(parents=True, exist_ok=True)
        for suffix, payload in ((".cubin", binary.cubin), (".json", json.dumps(data).encode())):
            fd, tmp = tempfile.mkstemp(dir=cache, prefix=".tmp-")
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
            os.replace(tmp, cache / f"{binary.source_hash}{suffix}")
    except OSError as exc:
        logger.warning("could not write the compile cache in %s: %s", cache, exc)


def _compile_quietly(request: CompileRequest) -> str | None:
    try:
        compile_cubin(request, cache_dir=default_cache_dir())
        return None
    except Exception as exc:  # noqa: BLE001 - reported to the caller, who measures (and fails) it later
        return f"{request.kernel}: {str(exc)[:300]}"


def compile_all(requests: list[CompileRequest], processes: int | None = None) -> list[str]:
    """Compile ``requests`` into the workers' cache on all cores (spawned processes: safe in a
    process that already holds a CUDA context), so that the measurements after find each cubin
    there. The errors, one line each (a failed source is measured, and fails, again later)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    unique = list(dict.fromkeys(requests))
    with ProcessPoolExecutor(processes or os.cpu_count(), mp_context=multiprocessing.get_context("spawn")) as pool:
        return [e for e in pool.map(_compile_quietly, unique) if e]


__all__ = ["binary_tags", "compile_all", "compile_cubin", "parse_ptxas", "ptxas_advisories", "resolve_backend",
           "source_hash", "toolkit_version"]
