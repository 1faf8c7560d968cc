"""Our own FA2-style attention forward in Triton, tuned by Triton's autotuner: a peer for ours.

    import torch
    from templates.attention import triton_peer

    if triton_peer.available():
        q, k, v = (torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.float16) for _ in range(3))
        tuned = triton_peer.tune(q, k, v, causal=True)  # autotunes this key on its first call
        print(tuned.seconds, tuned.config, tuned.already_tuned)  # 37.4 BLOCK_M=64 BLOCK_N=128 ... False
        o = triton_peer.attention(q, k, v, causal=True)  # the tuned kernel, (B, H, S, D) like q

Inputs q (B, H, S, D) and k, v (B, HKV, S, D) contiguous CUDA tensors, HKV dividing H (query head
h reads KV head h // (H // HKV): grouped-query attention where HKV < H), fp16 or bf16, D 64, 96,
128 or 256 (96 held as a 128-column tile, the columns past D masked), any S >= 1; causal is
top-left aligned (query i sees keys j <= i, as SDPA's ``is_causal`` with equal lengths).

The kernel: one program per (BLOCK_M query rows, b*h), online softmax in the exp2 domain
(log2(e) folded into the 1/sqrt(D) scale), fp32 accumulators, P rounded to the input type before
P.V (as FA2 does). The key loop has two stages: blocks no mask touches (no masking code), then the
blocks that need one: the key tail past S, or for causal the block(s) crossing the diagonal,
masked to -inf. Causal programs stop at their last row, so they see only blocks that intersect
the causal triangle. Rows whose every key is masked (l == 0) come out 0, not NaN.

``@triton.autotune`` picks BLOCK_M, BLOCK_N, stages and warps per key (B*H, S, D, causal, group, and
the tensors' dtype, which Triton's autotuner appends to every key itself), from ``CONFIG_SPACE``
less what ``fits`` rules out. Tuning a key compiles and times every config: 37-41 s a key on an
H100 with Triton 3.6 and a cold compile cache, mostly compiling; ``tune`` reports how long, and
which config won. To tune over another space, assign another tuple to ``CONFIG_SPACE`` (each
space keeps its own tuned keys). A call costs about 25 us of host time above Triton's own
launch (58 us a call in all, seen on an H100 machine), which counts only where a peer is timed
with the host behind the GPU.

This module imports neither torch nor Triton until a function needs them, so it imports on a
machine that has neither (CI's); there ``available()`` is False.
"""

import contextlib
import math
import threading
import time
from dataclasses import dataclass

HEAD_DIMS = (64, 96, 128, 256)
# (BLOCK_M, BLOCK_N, num_stages, num_warps): the usual space of FA2 forwards in Triton.
CONFIG_SPACE = tuple(
    (block_m, block_n, stages, warps)
    for block_m in (64, 128)
    for block_n in (32, 64, 128)
    for stages in (2, 3, 4)
    for warps in (4, 8)
)
SHARED_MEMORY_BYTES = 227 * 1024  # the most one block may take on the H100 and H200
MIN_BLOCK_M = 64  # the smallest tiles of CONFIG_SPACE: never pruned for a short S
MIN_BLOCK_N = 32
ELEMENT_BYTES = 2  # fp16 and bf16
MAX_GRID_Y = 65535  # B*H is the grid's second dimension


class PeerUnavailable(RuntimeError):
    """torch or Triton is missing, or no CUDA device is present."""


@dataclass(frozen=True)
class TunedPeer:
    """What tuning one key cost and chose.

    seconds: time.perf_counter around the key's first call (every config compiled and timed,
      then the winner run once), with torch.cuda.synchronize before and after.
    config: the chosen config as text, such as "BLOCK_M=128 BLOCK_N=64 stages=3 warps=8".
    already_tuned: the key had been tuned before this call (seconds and config are then those
      of that first tuning, and this call ran the tuned kernel only).
    """

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


def next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def block_d(head_dim: int) -> int:
    """The kernel's tile width over D: Triton's blocks are powers of two, so D=96 is held as 128
    columns, those past D masked (loaded as zeros, never stored)."""
    return next_power_of_two(head_dim)


def shared_memory_bytes(block_m: int, block_n: int, stages: int, head_dim: int) -> int:
    """An estimate of one program's shared memory: K and V tiles for each pipeline stage, and Q
    (D padded to a power of two)."""
    width = block_d(head_dim)
    return (2 * block_n * width * stages + block_m * width) * ELEMENT_BYTES


def fits(block_m: int, block_n: int, stages: int, head_dim: int, seq_len: int) -> bool:
    """Whether a config is worth timing for (D, S): its tiles fit in shared memory, and neither
    tile is longer than S rounded up to a power of two (a 128-key tile for S=40 is 3/4 waste),
    except the smallest tiles of the space, which always stay."""
    if shared_memory_bytes(block_m, block_n, stages, head_dim) > SHARED_MEMORY_BYTES:
        return False
    longest = next_power_of_two(seq_len)
    if block_n > max(MIN_BLOCK_N, longest) or block_m > max(MIN_BLOCK_M, longest):
        return False
    return True


def config_text(block_m: int, block_n: int, stages: int, warps: int) -> str:
    return f"BLOCK_M={block_m} BLOCK_N={block_n} stages={stages} warps={warps}"


def _config_tuple(config) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, stages, warps) of a triton.Config (or anything shaped like one)."""
    return (int(config.kwargs["BLOCK_M"]), int(config.kwargs["BLOCK_N"]),
            int(config.num_stages), int(config.num_warps))


def prune_configs(configs, named_args, **kwargs):
    """Triton's ``early_config_prune``: the configs that ``fits`` keeps for this call's S and D;
    where it keeps none (a space without small tiles, a tiny S), the one of least shared memory."""
    args = {**named_args, **kwargs}
    kept = set(_pruned([_config_tuple(c) for c in configs], int(args["S"]), int(args["HEAD_DIM"])))
    return [c for c in configs if _config_tuple(c) in kept]


def _pruned(space, seq_len: int, head_dim: int) -> list[tuple[int, int, int, int]]:
    kept = [c for c in space if fits(*c[:3], head_dim, seq_len)]
    if kept:
        return kept

    def footprint(config):
        block_m, block_n, stages, warps = config
        return (shared_memory_bytes(block_m, block_n, stages, head_dim), block_n, block_m, warps)

    return [min(space, key=footprint)]


# ---------------------------------------------------------------------------------------------
# The kernel, built on first use (the module globals below are set by _build).

triton = None
tl = None
_attn_fwd = None  # the @triton.jit kernel, every meta-parameter explicit
_attn_fwd_inner = None
# CONFIG_SPACE (as a tuple of int tuples) -> (triton.autotune(...)(_attn_fwd), its records:
# (B*H, S, D, causal, dtype) -> TunedPeer of the key's first call)
_autotuned: dict = {}
_current = (None, None, None)  # (the CONFIG_SPACE object last seen, its kernel, its records)
_lock = threading.RLock()
_NO_SWITCH = contextlib.nullcontext()


def _build():
    """Import Triton and define the kernels (once). They are module globals, so Triton finds
    ``tl`` and ``_attn_fwd_inner`` through the kernels' __globals__."""
    global triton, tl, _attn_fwd, _attn_fwd_inner
    if _attn_fwd is not None:
        return
    import triton
    import triton.language as tl

    @triton.jit
    def _attn_fwd_inner(acc, l_i, m_i, q, K_head, V_head, offs_m, offs_n, offs_d, S, qk_scale,
                        lo, hi,
                        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                        MASKED: tl.constexpr, CAUSAL: tl.constexpr, PAD_D: tl.constexpr):
        """Keys [lo, hi) in steps of BLOCK_N (lo a multiple of BLOCK_N). MASKED: keys >= S get
        -inf (their loads are masked), and with CAUSAL keys past each row's own index too.
        PAD_D: the tile's columns past HEAD_DIM load as zeros."""
        d_ok = offs_d < HEAD_DIM
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            cols = start_n + offs_n  # [BLOCK_N] key indices
            in_range = cols < S
            kv_offsets = cols[:, None] * HEAD_DIM + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
            if MASKED:
                if PAD_D:
                    k = tl.load(K_head + kv_offsets, mask=in_range[:, None] & d_ok[None, :], other=0.0)
                else:
                    k = tl.load(K_head + kv_offsets, mask=in_range[:, None], other=0.0)
            else:
                if PAD_D:
                    k = tl.load(K_head + kv_offsets, mask=d_ok[None, :], other=0.0)
                else:
                    k = tl.load(K_head + kv_offsets)
            qk = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N] fp32, input-type operands
            if MASKED:
                keep = in_range[None, :]
                if CAUSAL:
                    keep = keep & (offs_m[:, None] >= cols[None, :])
                qk = tl.where(keep, qk * qk_scale, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(qk, 1))
                # a row with every key so far masked keeps m = -inf: subtract 0 there, not -inf
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                qk = qk - m_use[:, None]
            else:
                m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
                m_use = m_new
                qk = qk * qk_scale - m_use[:, None]
            p = tl.math.exp2(qk)  # masked entries: exp2(-inf) = 0
            alpha = tl.math.exp2(m_i - m_use)  # first block: exp2(-inf) = 0
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            if MASKED:
                if PAD_D:
                    v = tl.load(V_head + kv_offsets, mask=in_range[:, None] & d_ok[None, :], other=0.0)
                else:
                    v = tl.load(V_head + kv_offsets, mask=in_range[:, None], other=0.0)
            else:
                if PAD_D:
                    v = tl.load(V_head + kv_offsets, mask=d_ok[None, :], other=0.0)
                else:
                    v = tl.load(V_head + kv_offsets)
            acc = tl.dot(p.to(v.dtype), v, acc)  # P rounded to the input type, as FA2 does
            m_i = m_new
        return acc, l_i, m_i

    @triton.jit
    def _attn_fwd(Q, K, V, O, BH, S, GROUP, qk_scale,
                  HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Grid (cdiv(S, BLOCK_M), B*H); Q, O contiguous (B, H, S, D), K, V (B, H / GROUP, S, D).
        qk_scale is log2(e)/sqrt(D). BH is unused in the body: it is part of the autotuner's key.
        BLOCK_D: D rounded up to a power of two (tl.arange's); PAD_D: BLOCK_D > D, the columns
        past D masked."""
        start_m = tl.program_id(0)
        head = tl.program_id(1).to(tl.int64) * S * HEAD_DIM
        kv_head = (tl.program_id(1) // GROUP).to(tl.int64) * S * HEAD_DIM
        Q_head = Q + head
        K_head = K + kv_head
        V_head = V + kv_head
        O_head = O + head
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        row_ok = offs_m < S
        q_offsets = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        if PAD_D:
            io_mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
        else:
            io_mask = row_ok[:, None]
        q = tl.load(Q_head + q_offsets, mask=io_mask, other=0.0)  # rows past S (and columns past D): 0

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        if CAUSAL:
            # keys below this block's first row are seen by all its rows (and are < S); blocks
            # from the one holding that first row up to its last row (or S) cross the diagonal
            mid = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N
            hi = tl.minimum((start_m + 1) * BLOCK_M, S)
        else:
            # whole key blocks, then the tail block (none when BLOCK_N divides S)
            mid = S // BLOCK_N * BLOCK_N
            hi = S
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_head, V_head, offs_m, offs_n, offs_d,
                                        S, qk_scale, 0, mid,
                                        HEAD_DIM, BLOCK_N, False, CAUSAL, PAD_D)
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_head, V_head, offs_m, offs_n, offs_d,
                                        S, qk_scale, mid, hi,
                                        HEAD_DIM, BLOCK_N, True, CAUSAL, PAD_D)
        l_i = tl.where(l_i == 0.0, 1.0, l_i)  # no key at all: acc is 0, and so is the row
        out = acc / l_i[:, None]
        tl.store(O_head + q_offsets, out.to(O.dtype.element_ty), mask=io_mask)


def _require():
    """torch and Triton, imported, with the kernels built; PeerUnavailable where they are not."""
    try:
        import torch
        import triton as _triton  # noqa: F401
    except Exception as error:  # noqa: BLE001
        raise PeerUnavailable(f"the Triton peer needs torch and triton: {error}") from None
    with _lock:
        _build()
    return torch


def _autotuned_kernel():
    """The autotuned kernel of the current CONFIG_SPACE, and its records. Kept for the space
    object last seen: rebuilding the space's key on every call cost 50 us a call."""
    global _current
    with _lock:
        raw = CONFIG_SPACE
        if _current[0] is raw:
            return _current[1], _current[2]
        space = tuple(tuple(int(x) for x in c) for c in raw)
        entry = _autotuned.get(space)
        if entry is None:
            configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=stages, num_warps=warps)
                       for bm, bn, stages, warps in space]
            kernel = triton.autotune(
                configs=configs,
                key=["BH", "S", "GROUP", "HEAD_DIM", "CAUSAL"],  # Triton appends the tensors' dtypes itself
                prune_configs_by={"early_config_prune": prune_configs},
            )(_attn_fwd)
            entry = _autotuned[space] = (kernel, {})
        _current = (raw, *entry)
        return entry


def _valid(torch, q, k, v, out) -> bool:
    """The common case of _check in few attribute reads (a launch's host time counts where a
    peer is timed with do_bench)."""
    try:
        shape, dtype, device = q.shape, q.dtype, q.device
        kv = k.shape
        return (len(shape) == 4 and shape[3] in HEAD_DIMS and 1 <= shape[2]
                and 1 <= shape[0] * shape[1] <= MAX_GRID_Y and shape[0] >= 1
                and len(kv) == 4 and kv[0] == shape[0] and kv[2:] == shape[2:] and kv[1] >= 1
                and shape[1] % kv[1] == 0 and v.shape == kv
                and (dtype is torch.float16 or dtype is torch.bfloat16) and device.type == "cuda"
                and all(type(t) is torch.Tensor and t.shape == want and t.dtype is dtype
                        and t.device == device and t.is_contiguous()
                        for t, want in ((q, shape), (k, kv), (v, kv)) + (((out, shape),) if out is not None else ())))
    except (AttributeError, TypeError):
        return False


def _check(torch, q, k, v, out):
    if _valid(torch, q, k, v, out):
        return
    for name, t in (("q", q), ("k", k), ("v", v)) + ((("out", out),) if out is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be (B, H, S, D), got shape {tuple(t.shape)}")
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}; q is {q.dtype} on {q.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be float16 or bfloat16, got {q.dtype}")
    if q.device.type != "cuda":
        raise ValueError(f"tensors must be on a CUDA device, got {q.device}")
    b, h, s, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[2:] != q.shape[2:] or k.shape[1] < 1 or h % k.shape[1]:
        raise ValueError(f"k and v {tuple(k.shape)}, {tuple(v.shape)} do not fit q {tuple(q.shape)}: (B, HKV, S, D) "
                         "with HKV dividing H")
    if out is not None and out.shape != q.shape:
        raise ValueError(f"out is {tuple(out.shape)}; q is {tuple(q.shape)}")
    if d not in HEAD_DIMS:
        raise ValueError(f"head dimension D must be one of {HEAD_DIMS}, got {d}")
    if s < 1 or b < 1 or h < 1:
        raise ValueError(f"empty problem {tuple(q.shape)}")
    if b * h > MAX_GRID_Y:
        raise ValueError(f"B*H = {b * h} is above the grid's {MAX_GRID_Y}")


def _arguments(q, k, v, out, causal):
    b, h, s, d = q.shape
    scale = math.log2(math.e) / math.sqrt(d)
    return (q, k, v, out, b * h, s, h // k.shape[1], scale, d, bool(causal), block_d(d), block_d(d) != d)


def _run(q, k, v, causal, out):
    """Launch the autotuned kernel; on a key's first call, time its tuning. -> (out, TunedPeer)."""
    torch = _require()
    _check(torch, q, k, v, out)
    if out is None:
        out = torch.empty_like(q)
    b, h, s, d = q.shape
    key = (b * h, s, h // k.shape[1], d, bool(causal), str(q.dtype))
    args = _arguments(q, k, v, out, causal)

    def grid(meta):
        return (triton.cdiv(s, meta["BLOCK_M"]), b * h)

    index = q.device.index
    switch = torch.cuda.device(index) if index is not None and index != torch.cuda.current_device() else _NO_SWITCH
    with _lock, switch:
        kernel, records = _autotuned_kernel()
        record = records.get(key)
        if record is not None:
            kernel[grid](*args)
            return out, TunedPeer(record.seconds, record.config, already_tuned=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        kernel[grid](*args)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        record = TunedPeer(seconds, config_text(*_config_tuple(kernel.best_config)), already_tuned=False)
        records[key] = record
        return out, record


def attention(q, k, v, causal: bool = False, *, out=None):
    """softmax(q k^T / sqrt(D)) v, causal or not, through the autotuned kernel (tuning the key
    on its first call). ``out``: a contiguous tensor like q to write into (every element is
    written); a new one otherwise. Returns the output."""
    result, _ = _run(q, k, v, causal, out)
    return result


def tune(q, k, v, causal: bool = False) -> TunedPeer:
    """Tune this key (B*H, S, group, D, causal, dtype) if it is not yet, and run the tuned kernel once.
    Returns the seconds its tuning took, the chosen config, and whether it was already tuned."""
    _, record = _run(q, k, v, causal, None)
    return record


def autotuned_configs(seq_len: int, head_dim: int) -> list[tuple[int, int, int, int]]:
    """The configs of CONFIG_SPACE the autotuner times for (S, D): what ``prune_configs`` keeps."""
    return _pruned([tuple(int(x) for x in c) for c in CONFIG_SPACE], seq_len, head_dim)


def precompile(keys, processes: int | None = None) -> int:
    """Compile, in parallel processes, every config the autotuner will time for each key
    (B*H, S, D, causal, "fp16" or "bf16"[, group: query heads a KV head serves, 1 if left out]) into
    Triton's on-disk cache, so that tuning those keys
    later only times them (Triton compiles one config at a time: 25-40 s a key from a cold cache).
    Launches nothing. Returns the number of kernels compiled or found in the cache."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    _require()
    jobs = sorted({(int(bh), int(s), int(d), bool(causal), str(dtype), int(group[0]) if group else 1, config)
                   for bh, s, d, causal, dtype, *group in keys for config in autotuned_configs(int(s), int(d))})
    if not jobs:
        return 0
    workers = max(1, min(len(jobs), processes or os.cpu_count() or 1))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return sum(pool.map(_compile_one, jobs, chunksize=max(1, len(jobs) // (4 * workers))))


def _compile_one(job) -> int:
    """One (B*H, S, D, causal, dtype, group, config) through JITFunction.warmup: the autotuner's
    specialisation (the integers' values, 16-byte-aligned pointers), compiled, not launched."""
    torch = _require()
    bh, s, d, causal, dtype, group, (block_m, block_n, stages, warps) = job
    element = torch.float16 if dtype == "fp16" else torch.bfloat16
    _attn_fwd.warmup(element, element, element, element, bh, s, group, math.log2(math.e) / math.sqrt(d), d, causal,
                     block_d(d), block_d(d) != d, BLOCK_M=block_m, BLOCK_N=block_n, num_stages=stages, num_warps=warps, grid=(1,))
    return 1


def _launch(q, k, v, causal: bool, config: tuple, *, out=None):
    """One explicit config (BLOCK_M, BLOCK_N, stages, warps), no autotuner: for tests, and to
    rerun a tuned config. Returns the output."""
    torch = _require()
    _check(torch, q, k, v, out)
    if out is None:
        out = torch.empty_like(q)
    block_m, block_n, stages, warps = (int(x) for x in config)
    b, h, s, d = q.shape
    with torch.cuda.device(q.device):
        _attn_fwd[(triton.cdiv(s, block_m), b * h)](
            *_arguments(q, k, v, out, causal), BLOCK_M=block_m, BLOCK_N=block_n,
            num_stages=stages, num_warps=warps)
    return out
