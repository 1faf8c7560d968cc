"""The attention family's peers: torch SDPA's three backends and our Triton kernel tuned by
Triton's autotuner (``triton_peer``), each a call on torch tensors of the family's own inputs.
``workers.peers`` checks each against the family's reference and times it as ours is timed."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from templates.attention.problem import group
from templates.family import PeerCall, Problem, autotuned_peer

SDPA_BACKENDS = ("flash", "cudnn", "efficient")


def peer_calls(problem: Problem, inputs: Mapping[str, np.ndarray]) -> dict[str, PeerCall]:
    """name -> a call computing ``problem`` on the GPU from ``inputs`` (SDPA's backends raise
    RuntimeError on a problem they refuse; the caller reports it)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from templates.attention import triton_peer

    dtype = torch.float16 if problem.dtype == "fp16" else torch.bfloat16
    q, k, v = (torch.from_numpy(inputs[n].view(np.int16)).view(dtype).cuda() for n in ("q", "k", "v"))  # k, v: HKV heads
    causal = problem.flag("causal")
    grouped = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}  # torch 2.5 and later
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}

    def sdpa(backend: Any) -> Any:
        def run() -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **grouped)
        return run

    calls = {name: PeerCall(sdpa(backends[name])) for name in SDPA_BACKENDS}
    calls["triton"] = autotuned_peer(triton_peer.available(), lambda: triton_peer.tune(q, k, v, causal),
                                     lambda: triton_peer.attention(q, k, v, causal))
    return calls


def prepare(problems: Sequence[Problem]) -> None:
    """The Triton peer's configs for every problem compiled on all cores, ahead of its autotuning."""
    from templates.attention import triton_peer

    if problems and triton_peer.available():
        triton_peer.precompile([(p.shape[0] * p.shape[1], p.shape[2], p.shape[3], p.flag("causal"), p.dtype,
                                 group(p.shape)) for p in problems])
