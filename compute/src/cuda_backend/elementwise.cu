// Element-wise kernels, grid-stride loops over `len` elements.

#define FOR_EACH(i, len) \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < (len); i += blockDim.x * gridDim.x)

// y[r, c] += bias[c]
extern "C" __global__ void add_bias(float* y, const float* bias, unsigned int len, unsigned int cols) {
    FOR_EACH(i, len) { y[i] += bias[i % cols]; }
}

// y = max(y, 0)
extern "C" __global__ void relu(float* y, unsigned int len) {
    FOR_EACH(i, len) { y[i] = fmaxf(y[i], 0.0f); }
}

// grad = 0 where the activation <= 0
extern "C" __global__ void relu_backward(float* grad, const float* activation, unsigned int len) {
    FOR_EACH(i, len) {
        if (activation[i] <= 0.0f) grad[i] = 0.0f;
    }
}

// y += alpha x
extern "C" __global__ void axpy(float* y, const float* x, float alpha, unsigned int len) {
    FOR_EACH(i, len) { y[i] += alpha * x[i]; }
}

// v = mu v - lr g; w = w + v
extern "C" __global__ void momentum(float* v, float* w, const float* g, float lr, float mu, unsigned int len) {
    FOR_EACH(i, len) {
        float vi = mu * v[i] - lr * g[i];
        v[i] = vi;
        w[i] += vi;
    }
}

// v = mu v - lr g; w = w + mu v - lr g
extern "C" __global__ void nesterov(float* v, float* w, const float* g, float lr, float mu, unsigned int len) {
    FOR_EACH(i, len) {
        float vi = mu * v[i] - lr * g[i];
        v[i] = vi;
        w[i] += mu * vi - lr * g[i];
    }
}

// AdamW: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; w -= lr (m / c1 / (sqrt(v / c2) + eps) + wd w)
extern "C" __global__ void adamw(float* m, float* v, float* w, const float* g, float lr, float b1, float b2,
                                 float eps, float wd, float c1, float c2, unsigned int len) {
    FOR_EACH(i, len) {
        float gi = g[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] -= lr * ((mi / c1) / (sqrtf(vi / c2) + eps) + wd * w[i]);
    }
}

// x = x + alpha (toward - x)
extern "C" __global__ void elastic_pull(float* x, const float* toward, float alpha, unsigned int len) {
    FOR_EACH(i, len) { x[i] += alpha * (toward[i] - x[i]); }
}
