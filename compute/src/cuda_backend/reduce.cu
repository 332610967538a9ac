// Column sums of a row-major matrix.

// out[c] = sum over r of x[r * cols + c]: one block of 256 threads per column.
extern "C" __global__ void sum_rows(const float* x, float* out, unsigned int rows, unsigned int cols) {
    __shared__ float partial[256];
    unsigned int col = blockIdx.x;
    float s = 0.0f;
    for (unsigned int r = threadIdx.x; r < rows; r += blockDim.x) s += x[(size_t)r * cols + col];
    partial[threadIdx.x] = s;
    __syncthreads();
    for (unsigned int width = blockDim.x / 2; width > 0; width >>= 1) {
        if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[col] = partial[0];
}
