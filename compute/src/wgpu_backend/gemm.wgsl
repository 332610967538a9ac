// c[m×n] = α · op(a) · op(b) + β · c, row-major, tiled: each 8×8 workgroup computes a 64×64
// tile of c, every invocation an 8×8 block of it (rows 8·ty.., columns 8·tx..) held in
// sixteen vec4 registers, stepping through k in slices of 16 that the workgroup stages in
// shared memory as vec4s of four consecutive rows of op(a) and four consecutive columns of
// op(b). Few invocations with much work each suit software rasterizers as well as GPUs.
//
// Split-K: when c has too few tiles to keep the device busy and k is long, workgroup z of
// the dispatch covers only k_len values of k from z · k_len and writes its partial product
// to slab z of a scratch buffer bound as c (α = 1, β = 0); `gemm_sum_slices` then folds the
// slabs into c. k_len is then a multiple of 16, so every staged slice lies in one k range.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    // Whether a is stored k×m (transposed) and b n×k.
    a_t: u32,
    b_t: u32,
    a_off: u32,
    b_off: u32,
    c_off: u32,
    // First row of c this dispatch covers (large m takes several dispatches).
    m_base: u32,
    alpha: f32,
    beta: f32,
    // The k values each workgroup covers: all of k, or one split-K slice.
    k_len: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

const TILE: u32 = 64u;
const SLICE: u32 = 16u;

// a_tile[kk * 16 + q] = op(a)[row0 + 4q .. row0 + 4q + 4, k0 + kk]
// b_tile[kk * 16 + q] = op(b)[k0 + kk, col0 + 4q .. col0 + 4q + 4]
var<workgroup> a_tile: array<vec4<f32>, 256>;
var<workgroup> b_tile: array<vec4<f32>, 256>;

fn load_a(row: u32, kk: u32) -> f32 {
    if row >= p.m || kk >= p.k {
        return 0.0;
    }
    if p.a_t != 0u {
        return a[p.a_off + kk * p.m + row];
    }
    return a[p.a_off + row * p.k + kk];
}

fn load_b(kk: u32, col: u32) -> f32 {
    if kk >= p.k || col >= p.n {
        return 0.0;
    }
    if p.b_t != 0u {
        return b[p.b_off + col * p.k + kk];
    }
    return b[p.b_off + kk * p.n + col];
}

// c[at] = α · v + β · c[at]; c is not read when β = 0: it may hold anything, NaN included.
fn scale_into(at: u32, v: f32) {
    if p.beta != 0.0 {
        c[at] = p.alpha * v + p.beta * c[at];
    } else {
        c[at] = p.alpha * v;
    }
}

fn store1(base: u32, row: u32, col: u32, v: f32) {
    if row < p.m && col < p.n {
        scale_into(base + row * p.n + col, v);
    }
}

fn store(base: u32, row: u32, col: u32, v: vec4<f32>) {
    store1(base, row, col, v.x);
    store1(base, row, col + 1u, v.y);
    store1(base, row, col + 2u, v.z);
    store1(base, row, col + 3u, v.w);
}

// Stage slice k0 of the tiles: each invocation loads four vec4s of each.
fn stage(t: u32, row0: u32, col0: u32, k0: u32) {
    for (var e = t; e < 256u; e += 64u) {
        let kk = k0 + e / 16u;
        let r = row0 + 4u * (e % 16u);
        a_tile[e] = vec4<f32>(load_a(r, kk), load_a(r + 1u, kk), load_a(r + 2u, kk), load_a(r + 3u, kk));
        b_tile[e] = vec4<f32>(load_b(kk, r - row0 + col0), load_b(kk, r - row0 + col0 + 1u),
                              load_b(kk, r - row0 + col0 + 2u), load_b(kk, r - row0 + col0 + 3u));
    }
}

@compute @workgroup_size(8, 8)
fn gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row0 = p.m_base + wid.y * TILE;
    let col0 = wid.x * TILE;
    let t = lid.y * 8u + lid.x;
    // Row r of the block, columns 0..4 and 4..8.
    var c00 = vec4<f32>(); var c01 = vec4<f32>();
    var c10 = vec4<f32>(); var c11 = vec4<f32>();
    var c20 = vec4<f32>(); var c21 = vec4<f32>();
    var c30 = vec4<f32>(); var c31 = vec4<f32>();
    var c40 = vec4<f32>(); var c41 = vec4<f32>();
    var c50 = vec4<f32>(); var c51 = vec4<f32>();
    var c60 = vec4<f32>(); var c61 = vec4<f32>();
    var c70 = vec4<f32>(); var c71 = vec4<f32>();
    let k_begin = wid.z * p.k_len;
    let k_end = min(p.k, k_begin + p.k_len);
    for (var k0 = k_begin; k0 < k_end; k0 += SLICE) {
        stage(t, row0, col0, k0);
        workgroupBarrier();
        for (var s = 0u; s < SLICE; s++) {
            let a0 = a_tile[s * 16u + 2u * lid.y];
            let a1 = a_tile[s * 16u + 2u * lid.y + 1u];
            let b0 = b_tile[s * 16u + 2u * lid.x];
            let b1 = b_tile[s * 16u + 2u * lid.x + 1u];
            c00 = fma(vec4<f32>(a0.x), b0, c00); c01 = fma(vec4<f32>(a0.x), b1, c01);
            c10 = fma(vec4<f32>(a0.y), b0, c10); c11 = fma(vec4<f32>(a0.y), b1, c11);
            c20 = fma(vec4<f32>(a0.z), b0, c20); c21 = fma(vec4<f32>(a0.z), b1, c21);
            c30 = fma(vec4<f32>(a0.w), b0, c30); c31 = fma(vec4<f32>(a0.w), b1, c31);
            c40 = fma(vec4<f32>(a1.x), b0, c40); c41 = fma(vec4<f32>(a1.x), b1, c41);
            c50 = fma(vec4<f32>(a1.y), b0, c50); c51 = fma(vec4<f32>(a1.y), b1, c51);
            c60 = fma(vec4<f32>(a1.z), b0, c60); c61 = fma(vec4<f32>(a1.z), b1, c61);
            c70 = fma(vec4<f32>(a1.w), b0, c70); c71 = fma(vec4<f32>(a1.w), b1, c71);
        }
        workgroupBarrier();
    }
    let base = p.c_off + wid.z * p.m * p.n;
    let row = row0 + 8u * lid.y;
    let col = col0 + 8u * lid.x;
    store(base, row, col, c00); store(base, row, col + 4u, c01);
    store(base, row + 1u, col, c10); store(base, row + 1u, col + 4u, c11);
    store(base, row + 2u, col, c20); store(base, row + 2u, col + 4u, c21);
    store(base, row + 3u, col, c30); store(base, row + 3u, col + 4u, c31);
    store(base, row + 4u, col, c40); store(base, row + 4u, col + 4u, c41);
    store(base, row + 5u, col, c50); store(base, row + 5u, col + 4u, c51);
    store(base, row + 6u, col, c60); store(base, row + 6u, col + 4u, c61);
    store(base, row + 7u, col, c70); store(base, row + 7u, col + 4u, c71);
}

// The split-K epilogue: c = α · Σ_z slab_z + β · c, one invocation per element of c, with
// the slabs bound as a.
@compute @workgroup_size(256)
fn gemm_sum_slices(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                   @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = (wid.y * groups.x + wid.x) * 256u + lid.x;
    let len = p.m * p.n;
    if i >= len {
        return;
    }
    let slices = (p.k + p.k_len - 1u) / p.k_len;
    var sum = 0.0;
    for (var z = 0u; z < slices; z++) {
        sum += a[z * len + i];
    }
    scale_into(p.c_off + i, sum);
}
