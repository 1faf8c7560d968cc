"""Our own matmul in Triton, tuned by Triton's autotuner: a peer for ours.

    import torch
    from templates.gemm import triton_peer

    if triton_peer.available():
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16).T  # the "nt" layout
        bias = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
        tuned = triton_peer.tune(a, b, bias, "bias_gelu")  # autotunes this key on its first call
        print(tuned.seconds, tuned.config)  # 21.3 BLOCK_M=128 BLOCK_N=256 BLOCK_K=64 stages=3 warps=8
        c = triton_peer.matmul(a, b, bias, "bias_gelu")  # the tuned kernel, M x N like a @ b

``a`` (M x K) and ``b`` (K x N) are CUDA tensors, fp16 or bf16, each contiguous or the transpose
of a contiguous tensor (any strides work; the autotuner keys on which dimension is contiguous);
``bias`` a length-N vector of their type or None; the epilogue one of the family's ("none",
"bias", "bias_relu", "bias_gelu", GELU in its erf form, "bias_gelu_tanh", in its tanh form). C is
M x N row-major, of a's type.

The kernel: the Triton tutorial's matmul. One program per BLOCK_M x BLOCK_N tile of C, tiles in
groups of GROUP_M tile rows (for L2), K in BLOCK_K steps with the tails masked to zero, fp32
accumulation, the epilogue on the accumulator before rounding to C's type.

``@triton.autotune`` picks tiles, stages and warps per key (M, N, K, layouts, epilogue, and the
tensors' dtype, which Triton appends itself) from ``CONFIG_SPACE``: the tutorial's list for
fp16 on Ampere and Hopper and its larger Hopper tiles. To tune over another space, assign
another tuple to ``CONFIG_SPACE``.

Block-scaled FP8 (``matmul_fp8``, ``tune_fp8``): ``a`` (M x K) and ``b`` (N x K) row-major
float8_e4m3fn, ``scale_a`` fp32 M x ceil(K/128) (per 1 x 128 of A), ``scale_b`` fp32
ceil(N/128) x ceil(K/128) (per 128 x 128 of B), C of ``out_dtype`` (bf16 or fp16) =
epilogue((A scale_a) (B scale_b)^T + bias). vLLM's block-FP8 kernel's scheme: each BLOCK_K step's
product (BLOCK_K dividing 128: one scale of each row of A and each column of B a step) is added
into the fp32 accumulator times those scales. Autotuned over ``FP8_CONFIG_SPACE``.

This module imports neither torch nor Triton until a function needs them, so it imports on a
machine that has neither (CI's); there ``available()`` is False.
"""

import threading
import time
from dataclasses import dataclass

EPILOGUES = ("none", "bias", "bias_relu", "bias_gelu", "bias_gelu_tanh")
# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
CONFIG_SPACE = (
    (128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
    (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 5, 2), (32, 64, 32, 5, 2),
    (128, 256, 64, 4, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 8), (64, 64, 64, 4, 4),
)
GROUP_M = 8
# Block FP8: (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps), BLOCK_K dividing the 128 of a scale.
FP8_CONFIG_SPACE = (
    (128, 128, 128, 3, 8), (128, 128, 64, 4, 4), (64, 128, 128, 4, 4), (128, 64, 128, 4, 4),
    (64, 64, 128, 4, 4), (128, 256, 128, 3, 8), (64, 256, 64, 4, 4), (256, 128, 128, 3, 8),
)
SCALE_BLOCK = 128


class PeerUnavailable(RuntimeError):
    """torch or Triton is missing, or no CUDA device is present."""


@dataclass(frozen=True)
class TunedPeer:
    """What tuning one key cost and chose: seconds around its first call (every config compiled
    and timed, the winner run once), the config as text, and whether it had been tuned before."""

    seconds: float
    config: str
    already_tuned: bool


def available() -> bool:
    """torch and Triton import and a CUDA device is present."""
    try:
        import torch
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - missing or broken installs alike mean "no"
        return False
    try:
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:  # noqa: BLE001
        return False


def config_text(block_m: int, block_n: int, block_k: int, stages: int, warps: int) -> str:
    return f"BLOCK_M={block_m} BLOCK_N={block_n} BLOCK_K={block_k} stages={stages} warps={warps}"


# ---------------------------------------------------------------------------------------------
# The kernel, built on first use (the module globals below are set by _build).

triton = None
tl = None
_matmul = None  # the @triton.jit kernel, every meta-parameter explicit
_matmul_fp8 = None  # the block-scaled FP8 one
_grouped_tile = None  # their tile order and epilogue, @triton.jit too
_epilogue = None
_autotuned: dict = {}  # (kernel name, config space) -> (the autotuned kernel, {key: TunedPeer})
_lock = threading.RLock()


def _build():
    """Import Triton and define the kernel (once); Triton finds ``tl`` through its globals."""
    global triton, tl, _matmul, _matmul_fp8, _grouped_tile, _epilogue
    if _matmul is not None:
        return
    import triton
    import triton.language as tl

    @triton.jit
    def _grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
        """This program's tile (row, column of tiles): GROUP_M rows of tiles at a time, column by
        column, so that neighbouring programs share A's rows and B's columns in L2."""
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BLOCK_M)
        tiles_n = tl.cdiv(N, BLOCK_N)
        per_group = GROUP_M * tiles_n
        first_m = pid // per_group * GROUP_M
        rows = tl.minimum(tiles_m - first_m, GROUP_M)
        return first_m + (pid % per_group) % rows, (pid % per_group) // rows

    @triton.jit
    def _epilogue(acc, Bias, offs_n, n_ok, EPILOGUE: tl.constexpr):
        """The fp32 tile after the epilogue: EPILOGUE 0 none, 1 + bias, 2 then ReLU, 3 then GELU
        (erf), 4 then GELU (tanh, as x / (1 + e^(-2u)), the same function)."""
        if EPILOGUE > 0:
            acc += tl.load(Bias + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if EPILOGUE == 2:
            acc = tl.maximum(acc, 0.0)
        if EPILOGUE == 3:
            acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
        if EPILOGUE == 4:
            acc = acc / (1.0 + tl.exp(-acc * (1.5957691216057308 + 0.0713548162726003 * acc * acc)))
        return acc

    @triton.jit
    def _matmul(A, B, Bias, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                A_ROW_MAJOR: tl.constexpr, B_ROW_MAJOR: tl.constexpr, EPILOGUE: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        """C = epilogue(A B + Bias); EPILOGUE 0 none, 1 bias, 2 bias + ReLU, 3 bias + GELU (erf),
        4 bias + GELU (tanh, as x / (1 + e^(-2u)), the same function). The *_ROW_MAJOR flags only
        key the autotuner (the strides say the layout)."""
        pid_m, pid_n = _grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = A + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = B + offs_k[:, None] * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = offs_k + k0 < K
            a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        acc = _epilogue(acc, Bias, offs_n, offs_n < N, EPILOGUE)
        c_ptrs = C + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    @triton.jit
    def _matmul_fp8(A, B, SA, SB, Bias, C, M, N, K, K_BLOCKS, EPILOGUE: tl.constexpr, SCALE_BLOCK: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        """C = epilogue((A SA) (B SB)^T + Bias): A M x K and B N x K row-major e4m3, SA M x K_BLOCKS
        and SB ceil(N / SCALE_BLOCK) x K_BLOCKS fp32; each step's product times its scales."""
        pid_m, pid_n = _grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        m_ok = offs_m < M
        n_ok = offs_n < N
        a_ptrs = A + offs_m[:, None].to(tl.int64) * K + offs_k[None, :]
        b_ptrs = B + offs_k[:, None] + offs_n[None, :].to(tl.int64) * K
        sa_ptrs = SA + offs_m.to(tl.int64) * K_BLOCKS
        sb_ptrs = SB + (offs_n // SCALE_BLOCK) * K_BLOCKS
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = offs_k + k0 < K
            a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            sa = tl.load(sa_ptrs + k0 // SCALE_BLOCK, mask=m_ok, other=0.0)
            sb = tl.load(sb_ptrs + k0 // SCALE_BLOCK, mask=n_ok, other=0.0)
            acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        acc = _epilogue(acc, Bias, offs_n, n_ok, EPILOGUE)
        c_ptrs = C + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _require():
    """torch and Triton, imported, with the kernel built; PeerUnavailable where they are not."""
    try:
        import torch
        import triton as _triton  # noqa: F401
    except Exception as error:  # noqa: BLE001
        raise PeerUnavailable(f"the Triton peer needs torch and triton: {error}") from None
    with _lock:
        _build()
    return torch


def _autotuned_kernel(fp8: bool = False):
    """The autotuned kernel of the current CONFIG_SPACE (fp8: the block-scaled FP8 kernel of
    FP8_CONFIG_SPACE), and its records."""
    space = tuple(tuple(int(x) for x in c) for c in (FP8_CONFIG_SPACE if fp8 else CONFIG_SPACE))
    entry = _autotuned.get((fp8, space))
    if entry is None:
        configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_stages=stages, num_warps=warps)
                   for bm, bn, bk, stages, warps in space]
        key = ["M", "N", "K", "EPILOGUE"] if fp8 else ["M", "N", "K", "A_ROW_MAJOR", "B_ROW_MAJOR", "EPILOGUE"]
        kernel = triton.autotune(configs=configs, key=key)(_matmul_fp8 if fp8 else _matmul)
        entry = _autotuned[(fp8, space)] = (kernel, {})
    return entry


def _run(a, b, bias, epilogue: str, out):
    """Launch the autotuned kernel; on a key's first call, time its tuning. -> (out, TunedPeer)."""
    torch = _require()
    if epilogue not in EPILOGUES:
        raise ValueError(f"unknown epilogue {epilogue!r} (one of {', '.join(EPILOGUES)})")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError(f"cannot multiply {tuple(a.shape)} {a.dtype} by {tuple(b.shape)} {b.dtype}")
    if (bias is None) != (epilogue == "none"):
        raise ValueError(f"epilogue {epilogue!r} {'needs' if bias is None else 'takes no'} bias")
    m, k = a.shape
    n = b.shape[1]
    if out is None:
        out = torch.empty((m, n), device=a.device, dtype=a.dtype)
    args = (a, b, bias if bias is not None else out, out, m, n, k, a.stride(0), a.stride(1), b.stride(0),
            b.stride(1), a.stride(1) == 1, b.stride(1) == 1, EPILOGUES.index(epilogue))
    key = (m, n, k, a.stride(1) == 1, b.stride(1) == 1, epilogue, str(a.dtype))

    with _lock, torch.cuda.device(a.device):
        return out, _launch_tuned(torch, _autotuned_kernel(), key, args, (m, n))


def _launch_tuned(torch, entry, key, args, shape) -> TunedPeer:
    """Launch an autotuned kernel (``entry``: it and its records) over an M x N grid of tiles; on
    a key's first call, time its tuning."""
    m, n = shape

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    kernel, records = entry
    record = records.get(key)
    if record is not None:
        kernel[grid](*args, GROUP_M=GROUP_M)
        return TunedPeer(record.seconds, record.config, already_tuned=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    kernel[grid](*args, GROUP_M=GROUP_M)
    torch.cuda.synchronize()
    best = kernel.best_config
    record = TunedPeer(time.perf_counter() - start, config_text(
        best.kwargs["BLOCK_M"], best.kwargs["BLOCK_N"], best.kwargs["BLOCK_K"], best.num_stages,
        best.num_warps), already_tuned=False)
    records[key] = record
    return record


def _run_fp8(a, b, scale_a, scale_b, bias, epilogue: str, out_dtype):
    """Launch the autotuned block-FP8 kernel. -> (out, TunedPeer)."""
    torch = _require()
    if epilogue not in EPILOGUES:
        raise ValueError(f"unknown epilogue {epilogue!r} (one of {', '.join(EPILOGUES)})")
    m, k = a.shape
    n = b.shape[0]
    k_blocks = -(-k // SCALE_BLOCK)
    if b.shape[1] != k or tuple(scale_a.shape) != (m, k_blocks) or \
            tuple(scale_b.shape) != (-(-n // SCALE_BLOCK), k_blocks):
        raise ValueError(f"block FP8: A {tuple(a.shape)}, B {tuple(b.shape)}, scales {tuple(scale_a.shape)} "
                         f"and {tuple(scale_b.shape)} do not match")
    if (bias is None) != (epilogue == "none"):
        raise ValueError(f"epilogue {epilogue!r} {'needs' if bias is None else 'takes no'} bias")
    out = torch.empty((m, n), device=a.device, dtype=out_dtype)
    args = (a, b, scale_a, scale_b, bias if bias is not None else out, out, m, n, k, k_blocks,
            EPILOGUES.index(epilogue), SCALE_BLOCK)
    with _lock, torch.cuda.device(a.device):
        return out, _launch_tuned(torch, _autotuned_kernel(fp8=True), (m, n, k, epilogue, str(out_dtype)), args,
                                  (m, n))


def matmul_fp8(a, b, scale_a, scale_b, bias=None, epilogue: str = "none", out_dtype=None):
    """Block-scaled FP8 epilogue((a scale_a) @ (b scale_b).T + bias) through the autotuned kernel
    (tuning the key on its first call); C of ``out_dtype`` (torch.bfloat16 by default)."""
    result, _ = _run_fp8(a, b, scale_a, scale_b, bias, epilogue, out_dtype or _require().bfloat16)
    return result


def tune_fp8(a, b, scale_a, scale_b, bias=None, epilogue: str = "none", out_dtype=None) -> TunedPeer:
    """Tune this block-FP8 key if it is not yet, and run the tuned kernel once."""
    _, record = _run_fp8(a, b, scale_a, scale_b, bias, epilogue, out_dtype or _require().bfloat16)
    return record


def matmul(a, b, bias=None, epilogue: str = "none", *, out=None):
    """epilogue(a @ b + bias) through the autotuned kernel (tuning the key on its first call).
    ``out``: a contiguous M x N tensor to write into; a new one otherwise. Returns the output."""
    result, _ = _run(a, b, bias, epilogue, out)
    return result


def tune(a, b, bias=None, epilogue: str = "none") -> TunedPeer:
    """Tune this key if it is not yet, and run the tuned kernel once."""
    _, record = _run(a, b, bias, epilogue, None)
    return record
