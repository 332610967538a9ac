// AdamW, one invocation per element, 256-wide workgroups on a 2-D grid.
// Binding 1 is the gradient; 2 and 3 the moments m and v; 4 the weights (all updated in place).

struct Params {
    len: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    // The bias corrections 1 − β1^t and 1 − β2^t.
    c1: f32,
    c2: f32,
    _pad3: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read_write> m: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> w: array<f32>;

// m ← β1 m + (1 − β1) g; v ← β2 v + (1 − β2) g²; w ← w − η (m / c1 / (√(v / c2) + ε) + λ w)
@compute @workgroup_size(256)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
         @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = (wid.y * groups.x + wid.x) * 256u + lid.x;
    if i < p.len {
        let gi = g[i];
        let mi = p.beta1 * m[i] + (1.0 - p.beta1) * gi;
        let vi = p.beta2 * v[i] + (1.0 - p.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] -= p.lr * ((mi / p.c1) / (sqrt(vi / p.c2) + p.eps) + p.weight_decay * w[i]);
    }
}
