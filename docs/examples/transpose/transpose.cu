// Tiled matrix transpose through shared memory (fp32): out (C x R) = in (R x C) transposed.
// A plain CUDA file, not a template: its tunables are #defines with defaults, and the transpose
// example family sets them for each config. Each block moves one TILE_DIM x TILE_DIM tile with
// TILE_DIM x BLOCK_ROWS threads; PAD 1 shifts each row of the tile by a bank.
#ifndef TILE_DIM
#define TILE_DIM 32
#endif
#define BLOCK_ROWS 8
#define PAD 1

extern "C" __global__ void transpose(float* __restrict__ out, const float* __restrict__ in, int rows, int cols) {
    __shared__ float tile[TILE_DIM][TILE_DIM + PAD];
    int x = blockIdx.x * TILE_DIM + threadIdx.x;  // a column of in
    int y = blockIdx.y * TILE_DIM + threadIdx.y;  // a row of in
    for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS)
        if (x < cols && y + j < rows) tile[threadIdx.y + j][threadIdx.x] = in[(size_t)(y + j) * cols + x];
    __syncthreads();
    x = blockIdx.y * TILE_DIM + threadIdx.x;  // a column of out
    y = blockIdx.x * TILE_DIM + threadIdx.y;  // a row of out
    for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS)
        if (x < rows && y + j < cols) out[(size_t)(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}
