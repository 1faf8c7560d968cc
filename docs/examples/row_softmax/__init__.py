"""Row softmax: y = softmax(x) over each row of x (R rows, C columns, fp16 or bf16), fp32 inside.

    tuner tune docs/examples/row_softmax --shape 4096,1000 --dtype fp16 --trials 30

Space: threads a block, rows a block (each row has THREADS / ROWS threads), elements a load.
"""

from templates.simple import kernel_family, torch


def constraints(p, s, device):
    if s.C % p.VEC:
        return f"divisibility: {p.VEC} elements a load do not divide {s.C} columns"
    if p.THREADS // p.ROWS < 8:
        return "threads: fewer than 8 threads a row"


@kernel_family(
    "softmax.cu.j2", shape="R, C", dtypes=("fp16", "bf16"),
    params=dict(THREADS=(256, 128, 512, 1024, 64), ROWS=(1, 2, 4, 8), VEC=(8, 4, 2, 1)),
    constraints=constraints,
    inputs=dict(x="R, C"), outputs=dict(y="R, C"), args="y, x, R, C",
    grid=lambda p, s: -(-s.R // p.ROWS), block=lambda p, s: p.THREADS,
    flops=lambda s: 5 * s.R * s.C,  # max, subtract, exponential, sum, scale
    peers=dict(torch=lambda x: torch.softmax(x, dim=-1)),
    suite=[("4096,1000", "fp16"), ("8192,4096", "bf16"), ("64,32768", "fp16")],
    starting_points=[dict(THREADS=256, ROWS=1, VEC=8), dict(THREADS=128, ROWS=1, VEC=8),
                     dict(THREADS=1024, ROWS=1, VEC=8), dict(THREADS=256, ROWS=8, VEC=8)],
)
def row_softmax(x):
    return torch.softmax(x, dim=-1)
