//! The WGSL kernels: each names its shader file and entry point, and is compiled into a
//! pipeline once, when the backend opens.

use std::collections::HashMap;

/// A compute kernel of the wgpu backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Kernel {
    Gemm,
    GemmSumSlices,
    AddBias,
    Relu,
    ReluBackward,
    Axpy,
    Momentum,
    Nesterov,
    AdamW,
    ElasticPull,
    SumRows,
    SoftmaxCrossEntropy,
    EvaluateLogits,
    Im2col,
    Col2im,
    Pool,
    PoolBackward,
}

const GEMM: &str = include_str!("gemm.wgsl");
const ELEMENTWISE: &str = include_str!("elementwise.wgsl");
const OPTIMIZER: &str = include_str!("optimizer.wgsl");
const REDUCE: &str = include_str!("reduce.wgsl");
const SOFTMAX: &str = include_str!("softmax.wgsl");
const IMAGE: &str = include_str!("image.wgsl");
const POOL: &str = include_str!("pool.wgsl");

impl Kernel {
    const ALL: [Self; 17] = [
        Self::Gemm,
        Self::GemmSumSlices,
        Self::AddBias,
        Self::Relu,
        Self::ReluBackward,
        Self::Axpy,
        Self::Momentum,
        Self::Nesterov,
        Self::AdamW,
        Self::ElasticPull,
        Self::SumRows,
        Self::SoftmaxCrossEntropy,
        Self::EvaluateLogits,
        Self::Im2col,
        Self::Col2im,
        Self::Pool,
        Self::PoolBackward,
    ];

    /// `(shader source, entry point)`.
    fn source(self) -> (&'static str, &'static str) {
        match self {
            Self::Gemm => (GEMM, "gemm"),
            Self::GemmSumSlices => (GEMM, "gemm_sum_slices"),
            Self::AddBias => (ELEMENTWISE, "add_bias"),
            Self::Relu => (ELEMENTWISE, "relu"),
            Self::ReluBackward => (ELEMENTWISE, "relu_backward"),
            Self::Axpy => (ELEMENTWISE, "axpy"),
            Self::Momentum => (ELEMENTWISE, "momentum"),
            Self::Nesterov => (ELEMENTWISE, "nesterov"),
            Self::AdamW => (OPTIMIZER, "adamw"),
            Self::ElasticPull => (ELEMENTWISE, "elastic_pull"),
            Self::SumRows => (REDUCE, "sum_rows"),
            Self::SoftmaxCrossEntropy => (SOFTMAX, "softmax_cross_entropy"),
            Self::EvaluateLogits => (SOFTMAX, "evaluate_logits"),
            Self::Im2col => (IMAGE, "im2col"),
            Self::Col2im => (IMAGE, "col2im"),
            Self::Pool => (POOL, "pool"),
            Self::PoolBackward => (POOL, "pool_backward"),
        }
    }
}

/// Every kernel's pipeline and the layout of its bind group.
pub(super) struct Pipelines {
    pipelines: HashMap<Kernel, (wgpu::ComputePipeline, wgpu::BindGroupLayout)>,
}

impl Pipelines {
    /// Compile every shader once and make every pipeline.
    pub(super) fn new(device: &wgpu::Device) -> Self {
        let mut modules: HashMap<&str, wgpu::ShaderModule> = HashMap::new();
        let pipelines = Kernel::ALL
            .into_iter()
            .map(|kernel| {
                let (source, entry) = kernel.source();
                let module = modules.entry(source).or_insert_with(|| {
                    device.create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(entry),
                        source: wgpu::ShaderSource::Wgsl(source.into()),
                    })
                });
                let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(entry),
                    layout: None,
                    module,
                    entry_point: Some(entry),
                    compilation_options: wgpu::PipelineCompilationOptions::default(),
                    cache: None,
                });
                let layout = pipeline.get_bind_group_layout(0);
                (kernel, (pipeline, layout))
            })
            .collect();
        Self { pipelines }
    }

    /// The pipeline of `kernel` and its bind group layout.
    pub(super) fn get(&self, kernel: Kernel) -> &(wgpu::ComputePipeline, wgpu::BindGroupLayout) {
        &self.pipelines[&kernel]
    }
}
