"""The GEMM family's peers: cuBLAS through ``torch.matmul`` or ``torch.addmm`` (ReLU and GELU's
tanh form in cuBLASLt's own epilogue, ``torch._addmm_activation``; GELU's erf form in torch after it) and
our Triton matmul tuned by Triton's autotuner (``triton_peer``), each a call on torch tensors of
the family's own inputs, in their stored layouts. e4m3: cuBLASLt's FP8 GEMM through
``torch._scaled_mm`` (per-tensor scales; block scales are refused there) and our block-scaled
Triton kernel (block scales; ``triton_peer.matmul_fp8``). ``workers.peers`` checks each against
the family's reference and times it as ours is timed."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from templates.family import PeerCall, Problem, autotuned_peer


def operands(problem: Problem, inputs: Mapping[str, np.ndarray]) -> tuple[Any, Any, Any]:
    """(A as M x K, B as K x N, bias or None): CUDA tensors over the stored layouts (a transposed
    operand is a transposed view, as a caller of cuBLAS would pass it)."""
    import torch

    dtype = torch.float16 if problem.dtype == "fp16" else torch.bfloat16

    def tensor(name: str) -> Any:
        return torch.from_numpy(np.ascontiguousarray(inputs[name]).view(np.int16)).view(dtype).cuda()

    a, b = tensor("a"), tensor("b")
    layout = problem.flag("layout")
    a = a.T if layout[0] == "t" else a
    b = b.T if layout[1] == "t" else b
    bias = tensor("bias") if problem.flag("epilogue") != "none" else None
    return a, b, bias


# cuBLASLt's fused epilogues, through torch._addmm_activation: epilogue -> (use_gelu, what it adds)
LT_EPILOGUES = {"bias_relu": (False, "ReLU"), "bias_gelu_tanh": (True, "GELU (tanh)")}


def peer_calls(problem: Problem, inputs: Mapping[str, np.ndarray]) -> dict[str, PeerCall]:
    """name -> a call computing ``problem`` on the GPU from ``inputs``."""
    from templates.gemm import triton_peer

    if problem.dtype == "e4m3":
        return fp8_peer_calls(problem, inputs)
    a, b, bias = operands(problem, inputs)
    epilogue = problem.flag("epilogue")
    return {"cublas": PeerCall(cublas_call(a, b, bias, epilogue), cublas_description(epilogue)),
            "triton": autotuned_peer(triton_peer.available(), lambda: triton_peer.tune(a, b, bias, epilogue),
                                     lambda: triton_peer.matmul(a, b, bias, epilogue))}


def cublas_call(a: Any, b: Any, bias: Any, epilogue: str) -> Callable[[], Any]:
    """cuBLAS's (cuBLASLt's, with a bias) call computing A B and ``epilogue`` on torch tensors."""
    import torch
    import torch.nn.functional as F

    def cublas() -> Any:
        if bias is None:
            return torch.matmul(a, b)
        if epilogue in LT_EPILOGUES:
            return torch._addmm_activation(bias, a, b, use_gelu=LT_EPILOGUES[epilogue][0])
        c = torch.addmm(bias, a, b)  # cuBLAS adds the bias in its own epilogue
        if epilogue == "bias_gelu":
            return F.gelu(c)
        return c

    return cublas


def fp8_operands(problem: Problem, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """e4m3: A (M x K) and B (N x K) as float8_e4m3fn CUDA tensors, their fp32 scales, the bias
    (C's type) or None."""
    import torch

    def tensor(name: str) -> Any:
        return torch.from_numpy(np.ascontiguousarray(inputs[name])).cuda()

    out = torch.float16 if problem.flag("out_dtype") == "fp16" else torch.bfloat16
    bias = tensor("bias").view(torch.int16).view(out) if problem.flag("epilogue") != "none" else None
    return {"a": tensor("a").view(torch.float8_e4m3fn), "b": tensor("b").view(torch.float8_e4m3fn),
            "scale_a": tensor("scale_a"), "scale_b": tensor("scale_b"), "bias": bias, "out": out}


def activation(c: Any, epilogue: str) -> Any:
    """The activation of ``epilogue`` in torch, after the bias."""
    import torch.nn.functional as F

    if epilogue == "bias_relu":
        return F.relu(c)
    if epilogue == "bias_gelu":
        return F.gelu(c)
    if epilogue == "bias_gelu_tanh":
        return F.gelu(c, approximate="tanh")
    return c


def fp8_peer_calls(problem: Problem, inputs: Mapping[str, np.ndarray]) -> dict[str, PeerCall]:
    """e4m3's peers: per tensor, cuBLASLt by torch._scaled_mm (the bias in its epilogue, the
    activation in torch after it); per block, our block-scaled Triton kernel. Each refuses the
    other's scales with a reason."""
    import torch

    from templates.gemm import triton_peer

    ops = fp8_operands(problem, inputs)
    epilogue = problem.flag("epilogue")
    if problem.flag("scale") == "block":
        args = (ops["a"], ops["b"], ops["scale_a"], ops["scale_b"], ops["bias"], epilogue, ops["out"])
        return {"cublas": PeerCall(None, "torch._scaled_mm: per-tensor scales only here (block scales refused)"),
                "triton": autotuned_peer(triton_peer.available(), lambda: triton_peer.tune_fp8(*args),
                                         lambda: triton_peer.matmul_fp8(*args), "block FP8, ")}
    n = problem.shape[1]
    calls = {"triton": PeerCall(None, "our Triton FP8 kernel takes block scales only (per-tensor: cuBLASLt)")}
    if n % 16:
        calls["cublas"] = PeerCall(None, f"torch._scaled_mm needs N a multiple of 16 (N={n})")
        return calls

    def scaled_mm() -> Any:
        c = torch._scaled_mm(ops["a"], ops["b"].t(), scale_a=ops["scale_a"], scale_b=ops["scale_b"],
                             bias=ops["bias"], out_dtype=ops["out"])
        return activation(c, epilogue)

    calls["cublas"] = PeerCall(scaled_mm, "torch._scaled_mm (cuBLASLt FP8, per-tensor scales)"
                               + ("" if epilogue in ("none", "bias") else f", then {epilogue[5:]} in torch"))
    return calls


def cublas_description(epilogue: str) -> str:
    """What the cuBLAS peer calls for ``epilogue``."""
    if epilogue == "none":
        return "torch.matmul"
    if epilogue in LT_EPILOGUES:
        gelu, adds = LT_EPILOGUES[epilogue]
        return f"torch._addmm_activation(use_gelu={gelu}): cuBLASLt's bias + {adds} epilogue"
    return f"torch.addmm, then {epilogue[5:] or 'nothing'}"


def prepare(problems: Sequence[Problem]) -> None:
    """Nothing ahead: the Triton peer compiles its dozen configs a key on first use."""
