// Max and mean pooling over channels-last images, and their gradients. A window's maximum
// is its first largest pixel in row-major order; its mean counts only pixels inside the image.
// Each invocation handles one pixel and loops over its channels.

struct Params {
    batch: u32,
    channels: u32,
    height: u32,
    width: u32,
    size: u32,
    stride: u32,
    pad: u32,
    out_h: u32,
    out_w: u32,
    // Pixels with work: output pixels (pool) or input pixels (pool_backward).
    len: u32,
    // 0: maximum, 1: mean.
    kind: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn element(wid: vec3<u32>, groups: vec3<u32>, lid: vec3<u32>) -> u32 {
    return (wid.y * groups.x + wid.x) * 256u + lid.x;
}

// The pixels [lo, hi) along an axis of `len` that window position o covers.
fn covered(o: u32, len: u32) -> vec2<u32> {
    let start = i32(o * p.stride) - i32(p.pad);
    return vec2<u32>(u32(max(start, 0)), u32(min(start + i32(p.size), i32(len))));
}

// Offset of channel 0 of input pixel (n, y, x).
fn at(n: u32, y: u32, xx: u32) -> u32 {
    return ((n * p.height + y) * p.width + xx) * p.channels;
}

// The offset of the first largest pixel of a window (rows ys, columns xs) in channel c.
fn argmax(n: u32, ys: vec2<u32>, xs: vec2<u32>, c: u32) -> u32 {
    var best = at(n, ys.x, xs.x) + c;
    for (var y = ys.x; y < ys.y; y++) {
        for (var xx = xs.x; xx < xs.y; xx++) {
            let i = at(n, y, xx) + c;
            if x[i] > x[best] {
                best = i;
            }
        }
    }
    return best;
}

// out = y: one invocation per output pixel
@compute @workgroup_size(256)
fn pool(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let o = element(wid, groups, lid);
    if o >= p.len {
        return;
    }
    let ox = o % p.out_w;
    let oy = (o / p.out_w) % p.out_h;
    let n = o / (p.out_w * p.out_h);
    let ys = covered(oy, p.height);
    let xs = covered(ox, p.width);
    let count = f32((ys.y - ys.x) * (xs.y - xs.x));
    for (var c = 0u; c < p.channels; c++) {
        if p.kind == 0u {
            out[o * p.channels + c] = x[argmax(n, ys, xs, c)];
        } else {
            var s = 0.0;
            for (var y = ys.x; y < ys.y; y++) {
                for (var xx = xs.x; xx < xs.y; xx++) {
                    s += x[at(n, y, xx) + c];
                }
            }
            out[o * p.channels + c] = s / count;
        }
    }
}

// out = dx: one invocation per input pixel, gathering from the windows that cover it
@compute @workgroup_size(256)
fn pool_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
    let pixel = element(wid, groups, lid);
    if pixel >= p.len {
        return;
    }
    let xx = pixel % p.width;
    let y = (pixel / p.width) % p.height;
    let n = pixel / (p.width * p.height);
    // Windows o with o·stride − pad ≤ pixel < o·stride − pad + size.
    let s = i32(p.stride);
    let oy_lo = max((i32(y + p.pad) - i32(p.size) + s) / s, 0);
    let oy_hi = min(i32(y + p.pad) / s, i32(p.out_h) - 1);
    let ox_lo = max((i32(xx + p.pad) - i32(p.size) + s) / s, 0);
    let ox_hi = min(i32(xx + p.pad) / s, i32(p.out_w) - 1);
    for (var c = 0u; c < p.channels; c++) {
        let me = pixel * p.channels + c;
        var g = 0.0;
        for (var oy = oy_lo; oy <= oy_hi; oy++) {
            let ys = covered(u32(oy), p.height);
            for (var ox = ox_lo; ox <= ox_hi; ox++) {
                let xs = covered(u32(ox), p.width);
                let o = ((n * p.out_h + u32(oy)) * p.out_w + u32(ox)) * p.channels + c;
                if p.kind == 0u {
                    if argmax(n, ys, xs, c) == me {
                        g += dy[o];
                    }
                } else {
                    g += dy[o] / f32((ys.y - ys.x) * (xs.y - xs.x));
                }
            }
        }
        out[me] = g;
    }
}
