// im2col, its adjoint, pooling and its gradient over channels-last images; a pixel (n, y, x)
// holds `channels` consecutive values. The column matrix has a row per output pixel and a
// column per (channel, dy, dx) of the window. A window's maximum is its first largest pixel
// in row-major order; its mean counts only pixels inside the image.

struct Geometry {
    unsigned int batch, channels, height, width, size, stride, pad, out_h, out_w;
};

__device__ Geometry geometry(unsigned int batch, unsigned int channels, unsigned int height, unsigned int width,
                             unsigned int size, unsigned int stride, unsigned int pad, unsigned int out_h,
                             unsigned int out_w) {
    Geometry g = {batch, channels, height, width, size, stride, pad, out_h, out_w};
    return g;
}

#define GEOMETRY_ARGS                                                                                     \
    unsigned int batch, unsigned int channels, unsigned int height, unsigned int width, unsigned int size, \
        unsigned int stride, unsigned int pad, unsigned int out_h, unsigned int out_w
#define GEOMETRY geometry(batch, channels, height, width, size, stride, pad, out_h, out_w)
#define FOR_EACH(i, len) \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < (len); i += blockDim.x * gridDim.x)

// The window positions [lo, hi] that cover pixel coordinate v along an axis with `outs` positions.
__device__ void covering(const Geometry& g, unsigned int v, unsigned int outs, int* lo, int* hi) {
    int s = (int)g.stride;
    int t = (int)(v + g.pad) - (int)g.size;
    *lo = t < 0 ? 0 : t / s + 1;
    int h = (int)(v + g.pad) / s;
    *hi = h < (int)outs - 1 ? h : (int)outs - 1;
}

// The pixels [lo, hi) along an axis of `len` that window position o covers.
__device__ void covered(const Geometry& g, unsigned int o, unsigned int len, unsigned int* lo, unsigned int* hi) {
    int start = (int)(o * g.stride) - (int)g.pad;
    int end = start + (int)g.size;
    *lo = start < 0 ? 0 : (unsigned int)start;
    *hi = end > (int)len ? len : (unsigned int)end;
}

__device__ size_t at(const Geometry& g, unsigned int n, unsigned int y, unsigned int x) {
    return (((size_t)n * g.height + y) * g.width + x) * g.channels;
}

// One thread per column-matrix row.
extern "C" __global__ void im2col(const float* x, float* col, unsigned int rows, GEOMETRY_ARGS) {
    Geometry g = GEOMETRY;
    unsigned int taps = g.size * g.size;
    FOR_EACH(row, rows) {
        unsigned int ox = row % g.out_w, oy = (row / g.out_w) % g.out_h, n = row / (g.out_w * g.out_h);
        float* out = col + (size_t)row * g.channels * taps;
        for (unsigned int dy = 0; dy < g.size; ++dy) {
            int y = (int)(oy * g.stride + dy) - (int)g.pad;
            for (unsigned int dx = 0; dx < g.size; ++dx) {
                int xx = (int)(ox * g.stride + dx) - (int)g.pad;
                bool inside = y >= 0 && xx >= 0 && y < (int)g.height && xx < (int)g.width;
                for (unsigned int c = 0; c < g.channels; ++c) {
                    out[c * taps + dy * g.size + dx] = inside ? x[at(g, n, y, xx) + c] : 0.0f;
                }
            }
        }
    }
}

// One thread per input pixel, summing for each channel the entries read from it.
extern "C" __global__ void col2im(const float* col, float* dx, unsigned int pixels, GEOMETRY_ARGS) {
    Geometry g = GEOMETRY;
    unsigned int taps = g.size * g.size;
    FOR_EACH(pixel, pixels) {
        unsigned int x = pixel % g.width, y = (pixel / g.width) % g.height, n = pixel / (g.width * g.height);
        int oy_lo, oy_hi, ox_lo, ox_hi;
        covering(g, y, g.out_h, &oy_lo, &oy_hi);
        covering(g, x, g.out_w, &ox_lo, &ox_hi);
        for (unsigned int c = 0; c < g.channels; ++c) {
            float sum = 0.0f;
            for (int oy = oy_lo; oy <= oy_hi; ++oy) {
                unsigned int dy = y + g.pad - oy * g.stride;
                for (int ox = ox_lo; ox <= ox_hi; ++ox) {
                    unsigned int dxx = x + g.pad - ox * g.stride;
                    size_t row = ((size_t)n * g.out_h + oy) * g.out_w + ox;
                    sum += col[(row * g.channels + c) * taps + dy * g.size + dxx];
                }
            }
            dx[(size_t)pixel * g.channels + c] = sum;
        }
    }
}

__device__ size_t argmax(const Geometry& g, const float* x, unsigned int n, unsigned int oy, unsigned int ox,
                         unsigned int c) {
    unsigned int y0, y1, x0, x1;
    covered(g, oy, g.height, &y0, &y1);
    covered(g, ox, g.width, &x0, &x1);
    size_t best = at(g, n, y0, x0) + c;
    for (unsigned int y = y0; y < y1; ++y)
        for (unsigned int xx = x0; xx < x1; ++xx) {
            size_t i = at(g, n, y, xx) + c;
            if (x[i] > x[best]) best = i;
        }
    return best;
}

__device__ float window_size(const Geometry& g, unsigned int oy, unsigned int ox) {
    unsigned int y0, y1, x0, x1;
    covered(g, oy, g.height, &y0, &y1);
    covered(g, ox, g.width, &x0, &x1);
    return (float)((y1 - y0) * (x1 - x0));
}

// One thread per output pixel; kind 0 is the maximum, 1 the mean.
extern "C" __global__ void pool(const float* x, float* y, unsigned int pixels, unsigned int kind, GEOMETRY_ARGS) {
    Geometry g = GEOMETRY;
    FOR_EACH(o, pixels) {
        unsigned int ox = o % g.out_w, oy = (o / g.out_w) % g.out_h, n = o / (g.out_w * g.out_h);
        unsigned int y0, y1, x0, x1;
        covered(g, oy, g.height, &y0, &y1);
        covered(g, ox, g.width, &x0, &x1);
        for (unsigned int c = 0; c < g.channels; ++c) {
            float v;
            if (kind == 0) {
                v = x[argmax(g, x, n, oy, ox, c)];
            } else {
                v = 0.0f;
                for (unsigned int yy = y0; yy < y1; ++yy)
                    for (unsigned int xx = x0; xx < x1; ++xx) v += x[at(g, n, yy, xx) + c];
                v /= window_size(g, oy, ox);
            }
            y[(size_t)o * g.channels + c] = v;
        }
    }
}

// One thread per input pixel, gathering from the windows that cover it.
extern "C" __global__ void pool_backward(const float* x, const float* dy, float* dx, unsigned int pixels,
                                         unsigned int kind, GEOMETRY_ARGS) {
    Geometry g = GEOMETRY;
    FOR_EACH(pixel, pixels) {
        unsigned int xx = pixel % g.width, y = (pixel / g.width) % g.height, n = pixel / (g.width * g.height);
        int oy_lo, oy_hi, ox_lo, ox_hi;
        covering(g, y, g.out_h, &oy_lo, &oy_hi);
        covering(g, xx, g.out_w, &ox_lo, &ox_hi);
        for (unsigned int c = 0; c < g.channels; ++c) {
            size_t me = (size_t)pixel * g.channels + c;
            float sum = 0.0f;
            for (int oy = oy_lo; oy <= oy_hi; ++oy)
                for (int ox = ox_lo; ox <= ox_hi; ++ox) {
                    size_t o = (((size_t)n * g.out_h + oy) * g.out_w + ox) * g.channels + c;
                    if (kind == 0) {
                        if (argmax(g, x, n, oy, ox, c) == me) sum += dy[o];
                    } else {
                        sum += dy[o] / window_size(g, oy, ox);
                    }
                }
            dx[me] = sum;
        }
    }
}
