"""Peers to compare a tuned kernel with, timed in this process the way GpuBench times ours.

    from workers.peers import time_peers
    results = time_peers("attention", problem, seed=0)   # {} when torch is not installed
    results["flash"].median_ms, results["flash"].error

The attention peers are torch's SDPA backends (FlashAttention-2, cuDNN, memory-efficient). They
run on the family's own inputs and are validated by the family's own reference, so their error
is the same metric as ours. Timing: warm-up, then each repetition after the workers' L2 flush
(a memset of ``l2_flush_bytes``), CUDA events around the call alone, median of the repetitions.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from templates.family import Problem, check_outputs
from workers.gpu import l2_flush_bytes, resolve_family

logger = logging.getLogger(__name__)

SDPA_BACKENDS = ("flash", "cudnn", "efficient")


@dataclass(frozen=True)
class PeerResult:
    name: str
    median_ms: float | None  # None when the backend refused the problem
    error: float | None
    note: str = ""


def time_peers(family_name: str, problem: Problem, *, seed: int = 0, reps: int = 100) -> dict[str, PeerResult]:
    """The peers of ``family_name`` on ``problem``; empty when none apply or torch is missing."""
    if family_name != "attention":
        return {}
    try:
        import torch
    except ImportError:
        logger.info("torch is not installed: no peers to compare with")
        return {}
    if not torch.cuda.is_available():
        return {}
    return _time_sdpa(torch, resolve_family(family_name), problem, seed, reps)


def _time_sdpa(torch: Any, family: Any, problem: Problem, seed: int, reps: int) -> dict[str, PeerResult]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.float16 if problem.dtype == "fp16" else torch.bfloat16
    host = family.inputs(problem, seed)
    q, k, v = (torch.from_numpy(host[n].view(np.int16)).view(dtype).cuda() for n in ("q", "k", "v"))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(l2_flush_bytes(l2), dtype=torch.int8, device="cuda")
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    results = {}
    for name in SDPA_BACKENDS:
        def run() -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=problem.causal)

        try:
            with sdpa_kernel(backends[name]):
                out = run()
                torch.cuda.synchronize()
                bits = out.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)
                check = check_outputs(family, problem, host, {"o": bits})
                for _ in range(10):
                    run()
                samples = []
                for _ in range(reps):
                    flush.zero_()
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    run()
                    end.record()
                    end.synchronize()
                    samples.append(start.elapsed_time(end))
        except RuntimeError as exc:  # the backend does not support this problem
            results[name] = PeerResult(name, None, None, str(exc).splitlines()[0][:120])
            continue
        results[name] = PeerResult(name, statistics.median(samples), check.error,
                                   "" if check.ok else (check.reason or "wrong"))
    return results
