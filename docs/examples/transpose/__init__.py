"""A kernel from a plain CUDA file (transpose.cu) with #define tunables, wrapped as it is: the
family names the .cu file as its template, and each config sets the file's #defines.

    tuner tune docs/examples/transpose --shape 8192,8192 --dtype fp32 --trials 30
"""

from templates.simple import kernel_family


@kernel_family(
    "transpose.cu", shape="R, C", dtypes=("fp32",),
    params=dict(TILE_DIM=(32, 16, 64), BLOCK_ROWS=(8, 4, 16, 2, 32), PAD=(1, 0)),
    constraints=lambda p, s, device: "tile: BLOCK_ROWS must divide TILE_DIM" if p.TILE_DIM % p.BLOCK_ROWS else None,
    inputs=dict(x="R, C"), outputs=dict(out="C, R"), args="out, x, R, C",
    grid=lambda p, s: (-(-s.C // p.TILE_DIM), -(-s.R // p.TILE_DIM)), block=lambda p, s: (p.TILE_DIM, p.BLOCK_ROWS),
    peers=dict(torch=lambda x: x.t().contiguous()),
    suite=[("8192,8192", "fp32"), ("1000001,7", "fp32")],
)
def transpose(x):
    return x.t()
