"""Fused residual-add + RMSNorm: r = x + residual; out = r / sqrt(mean(r^2) + eps) * weight.
Both out and r (res_out) are written; T tokens (rows) of hidden size H, fp16 or bf16.

    tuner tune docs/examples/rmsnorm --shape 4096,8192 --dtype bf16 --trials 30

Space: threads a block, rows at a time (each row has THREADS / ROWS threads), elements a load,
vectors a thread keeps in registers between the two passes, inputs read through the read-only
(non-coherent) path or not.
"""

from templates.simple import kernel_family, torch

EPS = 1e-6


def constraints(p, s, device):
    if s.H % p.VEC:
        return f"divisibility: {p.VEC} elements a load do not divide hidden {s.H}"
    if p.THREADS // p.ROWS < 8:
        return "threads: fewer than 8 threads a row"
    if (p.CACHE - 1) * p.THREADS // p.ROWS * p.VEC >= s.H:
        return "registers: fewer cached vectors cover the row"


@kernel_family(
    "rmsnorm.cu.j2", shape="T, H",
    params=dict(THREADS=(256, 128, 512, 1024, 64), ROWS=(1, 2, 4, 8), VEC=(8, 4, 2, 1),
                CACHE=(2, 1, 4, 8), NC=(0, 1)),
    constraints=constraints,
    inputs=dict(x="T, H", residual="T, H", weight="H"), outputs=dict(out="T, H", res_out="T, H"),
    args=["out", "res_out", "x", "residual", "weight", "T", "H", EPS],
    grid=lambda p, s: -(-s.T // p.ROWS), block=lambda p, s: p.THREADS,
    flops=lambda s: 5 * s.T * s.H,
    peers=dict(torch=lambda x, residual, weight, H: torch.rms_norm(x + residual, (H,), weight, EPS)),
    suite=[("4096,4096", "bf16"), ("4096,8192", "fp16"), ("16384,8192", "bf16"), ("1,4097", "bf16")],
    starting_points=[dict(THREADS=512, ROWS=1, VEC=8, CACHE=2, NC=0),
                     dict(THREADS=1024, ROWS=1, VEC=8, CACHE=1, NC=0),
                     dict(THREADS=256, ROWS=1, VEC=8, CACHE=4, NC=0),
                     dict(THREADS=256, ROWS=8, VEC=8, CACHE=1, NC=0)],
)
def rmsnorm(x, residual, weight):
    r = x + residual
    return r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS) * weight, r
