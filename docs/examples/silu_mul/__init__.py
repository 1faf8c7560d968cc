"""Fused SiLU-and-multiply: out = silu(x[:, :N]) * x[:, N:] for x of T rows and 2N columns.

    tuner tune docs/examples/silu_mul --shape 4096,11008 --dtype bf16 --trials 30
"""

from templates.simple import kernel_family, torch


@kernel_family(
    "silu_mul.cu.j2", shape="T, N",
    params=dict(THREADS=(256, 128, 512, 1024), VEC=(8, 4, 2, 1), ITEMS=(1, 2, 4)),
    constraints=lambda p, s, device: f"divisibility: {p.VEC} does not divide N={s.N}" if s.N % p.VEC else None,
    inputs=dict(x="T, 2 * N"), outputs=dict(out="T, N"), args="out, x, T, N",
    grid=lambda p, s: -(-s.T * s.N // (p.THREADS * p.VEC * p.ITEMS)), block=lambda p, s: p.THREADS,
    flops=lambda s: 5 * s.T * s.N,
    peers=dict(torch=lambda x, N: torch.nn.functional.silu(x[:, :N]) * x[:, N:]),
    suite=[("4096,11008", "bf16"), ("1,4097", "fp16")],
)
def silu_mul(x, N):
    a, b = x[:, :N], x[:, N:]
    return a * torch.sigmoid(a) * b
