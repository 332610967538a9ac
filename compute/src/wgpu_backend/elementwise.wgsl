// Element-wise kernels: one invocation per element, 256-wide workgroups on a 2-D grid.
// Binding 1 is the input, 2 the output (updated in place), 3 a second output.

struct Params {
    len: u32,
    // add_bias: columns of x and offset of the bias.
    cols: u32,
    off: u32,
    _pad0: u32,
    // axpy, elastic_pull: α; momentum, nesterov: η.
    alpha: f32,
    // momentum, nesterov: μ.
    beta: f32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> z: array<f32>;

fn element(wid: vec3<u32>, groups: vec3<u32>, lid: vec3<u32>) -> u32 {
    return (wid.y * groups.x + wid.x) * 256u + lid.x;
}

// y[r, c] += x[off + c]
@compute @workgroup_size(256)
fn add_bias(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = element(wid, groups, lid);
    if i < p.len {
        y[i] += x[p.off + i % p.cols];
    }
}

// y = max(y, 0)
@compute @workgroup_size(256)
fn relu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = element(wid, groups, lid);
    if i < p.len {
        y[i] = max(y[i], 0.0);
    }
}

// y = 0 where the activation x <= 0
@compute @workgroup_size(256)
fn relu_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = element(wid, groups, lid);
    if i < p.len && x[i] <= 0.0 {
        y[i] = 0.0;
    }
}

// y += α x
@compute @workgroup_size(256)
fn axpy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = element(wid, groups, lid);
    if i < p.len {
        y[i] += p.alpha * x[i];
    }
}

// v ← μ v − η g; w ← w + v   (x = g, y = v, z = w)
@compute @workgroup_size(256)
fn momentum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = element(wid, groups, lid);
    if i < p.len {
        let v = p.beta * y[i] - p.alpha * x[i];
        y[i] = v;
        z[i] += v;
    }
}

// v ← μ v − η g; w ← w + μ v − η g   (x = g, y = v, z = w)
@compute @workgroup_size(256)
fn nesterov(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = element(wid, groups, lid);
    if i < p.len {
        let v = p.beta * y[i] - p.alpha * x[i];
        y[i] = v;
        z[i] += p.beta * v - p.alpha * x[i];
    }
}

// y ← y + α (x − y)
@compute @workgroup_size(256)
fn elastic_pull(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = element(wid, groups, lid);
    if i < p.len {
        y[i] += p.alpha * (x[i] - y[i]);
    }
}
