// Softmax cross-entropy over rows of logits: one invocation per row (rows are short).

struct Params {
    rows: u32,
    cols: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> labels: array<u32>;
@group(0) @binding(3) var<storage, read_write> grad: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn row_index(wid: vec3<u32>, groups: vec3<u32>, lid: vec3<u32>) -> u32 {
    return (wid.y * groups.x + wid.x) * 256u + lid.x;
}

fn row_max(base: u32) -> f32 {
    var m = logits[base];
    for (var c = 1u; c < p.cols; c++) {
        m = max(m, logits[base + c]);
    }
    return m;
}

fn exp_sum(base: u32, m: f32) -> f32 {
    var s = 0.0;
    for (var c = 0u; c < p.cols; c++) {
        s += exp(logits[base + c] - m);
    }
    return s;
}

// out[r] = the row's cross-entropy; grad = (softmax − onehot) / rows
@compute @workgroup_size(256)
fn softmax_cross_entropy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                         @builtin(local_invocation_id) lid: vec3<u32>) {
    let r = row_index(wid, groups, lid);
    if r >= p.rows {
        return;
    }
    let base = r * p.cols;
    let m = row_max(base);
    let s = exp_sum(base, m);
    let label = labels[r];
    out[r] = log(s) - (logits[base + label] - m);
    let inv_rows = 1.0 / f32(p.rows);
    let scale = inv_rows / s;
    for (var c = 0u; c < p.cols; c++) {
        grad[base + c] = exp(logits[base + c] - m) * scale;
    }
    grad[base + label] -= inv_rows;
}

// out[2r] = the row's cross-entropy, out[2r + 1] = 1 if its first arg-max is the label
@compute @workgroup_size(256)
fn evaluate_logits(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                   @builtin(local_invocation_id) lid: vec3<u32>) {
    let r = row_index(wid, groups, lid);
    if r >= p.rows {
        return;
    }
    let base = r * p.cols;
    var arg = 0u;
    var best = logits[base];
    for (var c = 1u; c < p.cols; c++) {
        if logits[base + c] > best {
            best = logits[base + c];
            arg = c;
        }
    }
    let label = labels[r];
    out[2u * r] = log(exp_sum(base, best)) - (logits[base + label] - best);
    out[2u * r + 1u] = select(0.0, 1.0, arg == label);
}
