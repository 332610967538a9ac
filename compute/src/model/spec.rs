//! Model specifications, the built-in networks, and the flat parameter layout.

use std::fmt;
use std::ops::Range;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::ComputeError;
use crate::backend::{Conv2d, Images, Pool2d, PoolKind, Window};

/// The shape of a classifier: an optional convolutional front end, fully connected hidden
/// layers with ReLU, and a softmax over the classes.
///
/// With neither convolutions nor hidden layers it is multinomial logistic regression
/// (`softmax`); with hidden layers only, an MLP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModelSpec {
    /// Features per example (for a convolutional model, its image's
    /// `channels × height × width`).
    pub inputs: usize,
    /// The convolutional layers, if any; their output is flattened into the first fully
    /// connected layer.
    pub conv: Option<ConvSpec>,
    /// Widths of the hidden ReLU layers; empty for softmax regression.
    pub hidden: Vec<usize>,
    /// Number of classes.
    pub classes: usize,
}

/// One convolutional layer: a convolution with bias, ReLU, then pooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvLayer {
    /// Output channels.
    pub channels: usize,
    /// The convolution's window.
    pub window: Window,
    /// Maximum or mean pooling.
    pub pool: PoolKind,
    /// The pooling window.
    pub pool_window: Window,
}

/// The convolutional front end of a [`ModelSpec`]: the input image and a stack of
/// [`ConvLayer`]s, checked to fit together when made. Images are stored channels-last; the
/// flattened output is in `(y, x, channel)` order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ConvParts")]
pub struct ConvSpec {
    image: Images,
    layers: Vec<ConvLayer>,
}

/// The largest channel count, image side or window size of a [`ConvSpec`], so that no size
/// computed from them overflows.
const MAX_SIZE: usize = 4096;

/// [`ConvSpec`] as stored, before its check.
#[derive(Deserialize)]
struct ConvParts {
    image: Images,
    layers: Vec<ConvLayer>,
}

impl TryFrom<ConvParts> for ConvSpec {
    type Error = ComputeError;
    fn try_from(p: ConvParts) -> Result<Self, ComputeError> {
        Self::new(p.image.channels, p.image.height, p.image.width, p.layers)
    }
}

impl ConvSpec {
    /// Layers over `channels × height × width` images, or a shape error when a window does
    /// not fit the image it slides over or a layer has no channels.
    pub fn new(
        channels: usize,
        height: usize,
        width: usize,
        layers: Vec<ConvLayer>,
    ) -> Result<Self, ComputeError> {
        let image = Images { batch: 1, channels, height, width };
        let spec = Self { image, layers };
        let sizes = spec.layers.iter().flat_map(|l| {
            [
                l.channels,
                l.window.size,
                l.window.stride,
                l.window.pad,
                l.pool_window.size,
                l.pool_window.stride,
            ]
        });
        if let Some(big) = [channels, height, width].into_iter().chain(sizes).find(|&s| s > MAX_SIZE) {
            return Err(ComputeError::Shape(format!(
                "a convolutional model's sizes must not exceed {MAX_SIZE}, and {big} does"
            )));
        }
        if image.is_empty() || spec.layers.is_empty() {
            return Err(ComputeError::Shape(format!(
                "a convolutional model needs a non-empty image and layers, not {channels}×{height}×{width} with {} layers",
                spec.layers.len()
            )));
        }
        spec.geometry()?;
        Ok(spec)
    }

    /// The input image of one example (`batch` is 1).
    #[must_use]
    pub fn image(&self) -> Images {
        self.image
    }

    /// The layers, input first.
    #[must_use]
    pub fn layers(&self) -> &[ConvLayer] {
        &self.layers
    }

    /// Every layer's convolution and pooling for one image, and the final output.
    fn geometry(&self) -> Result<(Vec<(Conv2d, Pool2d)>, Images), ComputeError> {
        let mut input = self.image;
        let mut out = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            if l.channels == 0 {
                return Err(ComputeError::Shape("a convolutional layer needs at least one channel".into()));
            }
            let conv = Conv2d { input, window: l.window };
            let pool =
                Pool2d { input: l.window.output(input, l.channels)?, window: l.pool_window, kind: l.pool };
            input = pool.output()?;
            out.push((conv, pool));
        }
        Ok((out, input))
    }

    /// Features per example after the last layer.
    #[must_use]
    pub fn features(&self) -> usize {
        self.geometry().map_or(0, |(_, out)| out.len())
    }
}

impl fmt::Display for ConvSpec {
    /// `28×28×1 conv5x5x16 max2/2 conv5x5x32 max2/2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.image)?;
        for l in &self.layers {
            let (w, p) = (l.window, l.pool_window);
            let pool = match l.pool {
                PoolKind::Max => "max",
                PoolKind::Avg => "avg",
            };
            write!(f, " conv{0}x{0}x{1} {pool}{2}/{3}", w.size, l.channels, p.size, p.stride)?;
        }
        Ok(())
    }
}

/// One named tensor inside the flat parameter vector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorInfo {
    /// Conventional name, e.g. `fc1.weight`.
    pub name: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Where the tensor sits in the flat vector.
    pub range: Range<usize>,
}

/// Where every tensor of a model sits in the flat parameter vector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ParamLayout {
    /// The tensors in storage order.
    pub tensors: Vec<TensorInfo>,
    /// Total number of parameters.
    pub len: usize,
}

/// What one stage of the network computes, for one example (`batch` 1).
#[derive(Clone, Copy, Debug)]
pub(super) enum Op {
    /// im2col, a GEMM with the weights `[outputs, patch]`, bias.
    Conv { conv: Conv2d, outputs: usize, weight: usize, bias: usize },
    /// Pooling.
    Pool(Pool2d),
    /// A fully connected layer with weights `[outputs, inputs]` and bias.
    Dense { inputs: usize, outputs: usize, weight: usize, bias: usize },
}

/// A stage of the forward pass: its operation, whether ReLU follows, its width per example.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stage {
    pub(super) op: Op,
    pub(super) relu: bool,
    pub(super) width: usize,
}

/// `(weights, biases, fan_in, fan_out)` of a parameterised stage, for initialisation.
type Fans = (usize, usize, usize, usize);

impl ModelSpec {
    /// A fully connected model: softmax regression when `hidden` is empty, else an MLP.
    #[must_use]
    pub fn dense(inputs: usize, hidden: Vec<usize>, classes: usize) -> Self {
        Self { inputs, conv: None, hidden, classes }
    }

    /// The CNN for 28×28 grey images (MNIST, Fashion-MNIST): 5×5 convolutions with 16 and
    /// 32 channels (zero-padded), each followed by ReLU and 2×2 max-pooling, then a fully
    /// connected layer 1568 → 10. 28,938 parameters.
    #[must_use]
    pub fn cnn() -> Self {
        let conv = |channels| ConvLayer {
            channels,
            window: Window { size: 5, stride: 1, pad: 2 },
            pool: PoolKind::Max,
            pool_window: Window { size: 2, stride: 2, pad: 0 },
        };
        Self::convolutional(1, 28, vec![conv(16), conv(32)])
    }

    /// Rudra's CIFAR-10 network (Caffe's `cifar10_full` without local response
    /// normalisation): three zero-padded 5×5 convolutions with 32, 32 and 64 channels, each
    /// followed by ReLU and 3×3 pooling with stride 2 (maximum after the first, mean after the
    /// others), then a 1024 → 10 classifier. 89,578 parameters.
    #[must_use]
    pub fn cifar10_net() -> Self {
        let conv = |channels, pool| ConvLayer {
            channels,
            window: Window { size: 5, stride: 1, pad: 2 },
            pool,
            pool_window: Window { size: 3, stride: 2, pad: 1 },
        };
        Self::convolutional(
            3,
            32,
            vec![conv(32, PoolKind::Max), conv(32, PoolKind::Avg), conv(64, PoolKind::Avg)],
        )
    }

    /// A built-in network over square images with a direct classifier into 10 classes.
    fn convolutional(channels: usize, side: usize, layers: Vec<ConvLayer>) -> Self {
        let conv =
            ConvSpec::new(channels, side, side, layers).expect("the built-in networks fit their images");
        Self { inputs: conv.image().len(), conv: Some(conv), hidden: Vec::new(), classes: 10 }
    }

    /// Check that the parts fit: the image holds `inputs` features and no width is zero.
    pub fn check(&self) -> Result<(), ComputeError> {
        if let Some(conv) = &self.conv
            && conv.image().len() != self.inputs
        {
            return Err(ComputeError::Shape(format!(
                "the convolutional layers read {} images ({} features), not {}",
                conv.image(),
                conv.image().len(),
                self.inputs
            )));
        }
        if self.inputs == 0 || self.classes == 0 || self.hidden.contains(&0) {
            return Err(ComputeError::Shape(format!(
                "a model needs non-zero widths, not {} inputs, hidden {:?}, {} classes",
                self.inputs, self.hidden, self.classes
            )));
        }
        Ok(())
    }

    /// The stages of the forward pass, with the fans of the parameterised ones.
    pub(super) fn stages(&self) -> Vec<(Stage, Option<Fans>)> {
        let mut stages = Vec::new();
        let mut at = 0;
        let mut param = |n: usize| {
            at += n;
            at - n
        };
        let mut width = self.inputs;
        if let Some(spec) = &self.conv {
            let (layers, out) = spec.geometry().expect("checked when the spec was made");
            for ((conv, pool), l) in layers.into_iter().zip(&spec.layers) {
                let patch = conv.patch();
                let op = Op::Conv {
                    conv,
                    outputs: l.channels,
                    weight: param(l.channels * patch),
                    bias: param(l.channels),
                };
                let fans =
                    (l.channels * patch, l.channels, patch, l.channels * l.window.size * l.window.size);
                stages.push((Stage { op, relu: true, width: pool.input.len() }, Some(fans)));
                stages.push((
                    Stage { op: Op::Pool(pool), relu: false, width: pool.output().map_or(0, |o| o.len()) },
                    None,
                ));
            }
            width = out.len();
        }
        let outs: Vec<usize> = self.hidden.iter().copied().chain(std::iter::once(self.classes)).collect();
        for (i, &outputs) in outs.iter().enumerate() {
            let op =
                Op::Dense { inputs: width, outputs, weight: param(outputs * width), bias: param(outputs) };
            stages.push((
                Stage { op, relu: i + 1 < outs.len(), width: outputs },
                Some((outputs * width, outputs, width, outputs)),
            ));
            width = outputs;
        }
        stages
    }

    /// The flat layout of this model's parameters: `convN.weight` (`[out, in, size, size]`)
    /// and `convN.bias`, then `fcN.weight` (`[out, in]`) and `fcN.bias`, in that order.
    #[must_use]
    pub fn layout(&self) -> ParamLayout {
        let mut tensors = Vec::new();
        let (mut convs, mut fcs) = (0, 0);
        let mut push = |name: String, shape: Vec<usize>, start: usize| {
            let len: usize = shape.iter().product();
            tensors.push(TensorInfo { name, shape, range: start..start + len });
        };
        for (stage, _) in self.stages() {
            match stage.op {
                Op::Conv { conv, outputs, weight, bias } => {
                    convs += 1;
                    let k = conv.window.size;
                    push(format!("conv{convs}.weight"), vec![outputs, conv.input.channels, k, k], weight);
                    push(format!("conv{convs}.bias"), vec![outputs], bias);
                }
                Op::Dense { inputs, outputs, weight, bias } => {
                    fcs += 1;
                    push(format!("fc{fcs}.weight"), vec![outputs, inputs], weight);
                    push(format!("fc{fcs}.bias"), vec![outputs], bias);
                }
                Op::Pool(_) => {}
            }
        }
        let len = tensors.last().map_or(0, |t| t.range.end);
        ParamLayout { tensors, len }
    }

    /// Glorot-uniform weights and zero biases, reproducible from `seed`.
    #[must_use]
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut params = Vec::with_capacity(self.layout().len);
        for (weights, biases, fan_in, fan_out) in self.stages().into_iter().filter_map(|(_, fans)| fans) {
            let limit = (6.0 / (fan_in + fan_out) as f32).sqrt();
            params.extend((0..weights).map(|_| rng.random_range(-limit..limit)));
            params.extend(std::iter::repeat_n(0.0, biases));
        }
        params
    }
}

impl fmt::Display for Images {
    /// `height×width×channels`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}×{}×{}", self.height, self.width, self.channels)
    }
}
