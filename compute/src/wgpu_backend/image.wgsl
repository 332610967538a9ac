// im2col and its adjoint over channels-last images. The column matrix has a row per output
// pixel (n, oy, ox) and a column per (channel, dy, dx) of the window. Each invocation handles
// one pixel and loops over its channels, so that the integer divisions that locate a pixel
// are done once per pixel.

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
    // Pixels with work: output pixels (im2col) or input pixels (col2im).
    len: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

fn element(wid: vec3<u32>, groups: vec3<u32>, lid: vec3<u32>) -> u32 {
    return (wid.y * groups.x + wid.x) * 256u + lid.x;
}

// dst = col, src = x: one invocation per row of the column matrix
@compute @workgroup_size(256)
fn im2col(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
          @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = element(wid, groups, lid);
    if row >= p.len {
        return;
    }
    let taps = p.size * p.size;
    let ox = row % p.out_w;
    let oy = (row / p.out_w) % p.out_h;
    let n = row / (p.out_w * p.out_h);
    let base = row * p.channels * taps;
    for (var dy = 0u; dy < p.size; dy++) {
        let y = i32(oy * p.stride + dy) - i32(p.pad);
        for (var dx = 0u; dx < p.size; dx++) {
            let x = i32(ox * p.stride + dx) - i32(p.pad);
            let inside = y >= 0 && x >= 0 && y < i32(p.height) && x < i32(p.width);
            let pixel = ((n * p.height + u32(max(y, 0))) * p.width + u32(max(x, 0))) * p.channels;
            for (var c = 0u; c < p.channels; c++) {
                var v = 0.0;
                if inside {
                    v = src[pixel + c];
                }
                dst[base + c * taps + dy * p.size + dx] = v;
            }
        }
    }
}

// dst = dx, src = col: one invocation per input pixel, summing for each channel the entries
// read from it by the window positions that cover it
@compute @workgroup_size(256)
fn col2im(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
          @builtin(local_invocation_id) lid: vec3<u32>) {
    let pixel = element(wid, groups, lid);
    if pixel >= p.len {
        return;
    }
    let x = pixel % p.width;
    let y = (pixel / p.width) % p.height;
    let n = pixel / (p.width * p.height);
    let taps = p.size * p.size;
    // Window positions o with o·stride − pad ≤ pixel < o·stride − pad + size.
    let s = i32(p.stride);
    let oy_lo = max((i32(y + p.pad) - i32(p.size) + s) / s, 0);
    let oy_hi = min(i32(y + p.pad) / s, i32(p.out_h) - 1);
    let ox_lo = max((i32(x + p.pad) - i32(p.size) + s) / s, 0);
    let ox_hi = min(i32(x + p.pad) / s, i32(p.out_w) - 1);
    for (var c = 0u; c < p.channels; c++) {
        var sum = 0.0;
        for (var oy = oy_lo; oy <= oy_hi; oy++) {
            let dy = u32(i32(y + p.pad) - oy * s);
            for (var ox = ox_lo; ox <= ox_hi; ox++) {
                let dx = u32(i32(x + p.pad) - ox * s);
                let row = (n * p.out_h + u32(oy)) * p.out_w + u32(ox);
                sum += src[(row * p.channels + c) * taps + dy * p.size + dx];
            }
        }
        dst[pixel * p.channels + c] = sum;
    }
}
