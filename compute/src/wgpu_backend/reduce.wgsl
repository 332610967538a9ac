// out[off + c] = Σ_r x[r × cols + c]: one 256-wide workgroup per column, each invocation
// summing a stride of rows, then a tree reduction in shared memory.

struct Params {
    rows: u32,
    cols: u32,
    off: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(256)
fn sum_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
    let col = wid.y * groups.x + wid.x;
    var s = 0.0;
    if col < p.cols {
        for (var r = lid.x; r < p.rows; r += 256u) {
            s += x[r * p.cols + col];
        }
    }
    partial[lid.x] = s;
    workgroupBarrier();
    for (var width = 128u; width > 0u; width >>= 1u) {
        if lid.x < width {
            partial[lid.x] += partial[lid.x + width];
        }
        workgroupBarrier();
    }
    if lid.x == 0u && col < p.cols {
        out[p.off + col] = partial[0];
    }
}
