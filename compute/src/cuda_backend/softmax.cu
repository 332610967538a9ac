// Softmax cross-entropy over rows of logits: one thread per row (rows are short).

// losses[r] = the row's cross-entropy; grad = (softmax - onehot) / rows
extern "C" __global__ void softmax_cross_entropy(const float* logits, const unsigned int* labels, float* grad,
                                                 float* losses, unsigned int rows, unsigned int cols) {
    unsigned int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* row = logits + (size_t)r * cols;
    float* g = grad + (size_t)r * cols;
    float m = row[0];
    for (unsigned int c = 1; c < cols; ++c) m = fmaxf(m, row[c]);
    float s = 0.0f;
    for (unsigned int c = 0; c < cols; ++c) s += expf(row[c] - m);
    unsigned int label = labels[r];
    losses[r] = logf(s) - (row[label] - m);
    float inv_rows = 1.0f / (float)rows;
    float scale = inv_rows / s;
    for (unsigned int c = 0; c < cols; ++c) g[c] = expf(row[c] - m) * scale;
    g[label] -= inv_rows;
}

// out[2r] = the row's cross-entropy, out[2r + 1] = 1 if its first arg-max is the label
extern "C" __global__ void evaluate_logits(const float* logits, const unsigned int* labels, float* out,
                                           unsigned int rows, unsigned int cols) {
    unsigned int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* row = logits + (size_t)r * cols;
    unsigned int arg = 0;
    float best = row[0];
    for (unsigned int c = 1; c < cols; ++c) {
        if (row[c] > best) {
            best = row[c];
            arg = c;
        }
    }
    float s = 0.0f;
    for (unsigned int c = 0; c < cols; ++c) s += expf(row[c] - best);
    unsigned int label = labels[r];
    out[2 * r] = logf(s) - (row[label] - best);
    out[2 * r + 1] = arg == label ? 1.0f : 0.0f;
}
