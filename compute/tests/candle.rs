//! A candle network through [`CandleModel`]: its gradient is candle's own backward pass, laid
//! out in Rudra's flat vector, and the same network as Rudra's built-in MLP gives the same
//! gradient.

#![cfg(feature = "candle")]

use candle_core::{DType, Device, Tensor};
use candle_nn::{Linear, Module, VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rudra_compute::{CandleModel, CpuBackend, GradientModel, Model, ModelSpec};

const INPUTS: usize = 6;
const HIDDEN: usize = 5;
const CLASSES: usize = 3;

/// A 6-5-3 MLP with ReLU in candle: its variables and its two layers.
fn network() -> (VarMap, Linear, Linear) {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let fc1 = candle_nn::linear(INPUTS, HIDDEN, vb.pp("fc1")).unwrap();
    let fc2 = candle_nn::linear(HIDDEN, CLASSES, vb.pp("fc2")).unwrap();
    (varmap, fc1, fc2)
}

fn forward(fc1: &Linear, fc2: &Linear, x: &Tensor) -> candle_core::Result<Tensor> {
    fc2.forward(&fc1.forward(x)?.relu()?)
}

fn batch(rows: usize, seed: u64) -> (Vec<f32>, Vec<u8>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let x = (0..rows * INPUTS).map(|_| rng.random_range(-1.0..1.0)).collect();
    let y = (0..rows).map(|_| rng.random_range(0..CLASSES as u8)).collect();
    (x, y)
}

#[test]
fn the_gradient_is_candles_own_backward_pass_in_name_order() {
    let (varmap, fc1, fc2) = network();
    let (a, b) = (fc1.clone(), fc2.clone());
    let mut model = CandleModel::new(&varmap, INPUTS, move |x| forward(&a, &b, x)).unwrap();
    let n = (INPUTS + 1) * HIDDEN + (HIDDEN + 1) * CLASSES;
    assert_eq!(model.param_count(), n);
    // Rudra writes new parameters (as a shard's answer would), partly across two variables.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let params: Vec<f32> = (0..n).map(|_| rng.random_range(-0.5..0.5)).collect();
    model.write_params(0, &params[..20]).unwrap();
    model.write_params(20, &params[20..]).unwrap();
    let (x, y) = batch(8, 4);
    let loss = model.loss_and_gradient(&x, &y).unwrap();
    let mut grad = vec![0.0; n];
    model.take_gradient(&mut grad).unwrap();

    // candle by itself, on the same variables: backward, each gradient flattened in name order.
    let xs = Tensor::from_slice(&x, (8, INPUTS), &Device::Cpu).unwrap();
    let ys = Tensor::from_vec(y.iter().map(|&l| u32::from(l)).collect::<Vec<_>>(), 8, &Device::Cpu).unwrap();
    let want_loss = candle_nn::loss::cross_entropy(&forward(&fc1, &fc2, &xs).unwrap(), &ys).unwrap();
    let grads = want_loss.backward().unwrap();
    let mut vars: Vec<_> = varmap.data().lock().unwrap().clone().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let mut want = Vec::new();
    let mut written = Vec::new();
    for (_, var) in &vars {
        written.extend(var.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap());
        want.extend(grads.get(var.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap());
    }
    assert_eq!(written, params, "the variables hold what Rudra wrote, in name order");
    assert_eq!(loss, want_loss.to_scalar::<f32>().unwrap());
    assert_eq!(grad, want);
    assert!(model.write_params(n - 1, &[0.0, 0.0]).is_err(), "a write past the end is refused");
}

#[test]
fn a_candle_mlp_and_rudras_mlp_with_the_same_weights_agree() {
    let (varmap, fc1, fc2) = network();
    let mut candle = CandleModel::new(&varmap, INPUTS, move |x| forward(&fc1, &fc2, x)).unwrap();
    let spec = ModelSpec::dense(INPUTS, vec![HIDDEN], CLASSES);
    let mut rudra = Model::new(CpuBackend, spec.clone()).unwrap();
    let rudra_params = spec.init(9);
    rudra.write_params(0, &rudra_params).unwrap();
    // Rudra lays out fc1.weight, fc1.bias, fc2.weight, fc2.bias; candle's names sort biases first.
    let layout = spec.layout();
    let tensor = |name: &str| {
        let t = layout.tensors.iter().find(|t| t.name == name).unwrap();
        t.range.clone()
    };
    let order = ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"];
    let in_candle_order: Vec<f32> = order.iter().flat_map(|n| rudra_params[tensor(n)].to_vec()).collect();
    candle.write_params(0, &in_candle_order).unwrap();
    let (x, y) = batch(16, 5);
    let (l1, l2) = (candle.loss_and_gradient(&x, &y).unwrap(), rudra.loss_and_gradient(&x, &y).unwrap());
    assert!((l1 - l2).abs() < 1e-5, "loss: candle {l1}, Rudra {l2}");
    let (mut g1, mut g2) = (vec![0.0; in_candle_order.len()], vec![0.0; rudra_params.len()]);
    candle.take_gradient(&mut g1).unwrap();
    rudra.take_gradient(&mut g2).unwrap();
    let rudra_in_candle_order: Vec<f32> = order.iter().flat_map(|n| g2[tensor(n)].to_vec()).collect();
    let worst = g1.iter().zip(&rudra_in_candle_order).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst < 1e-5, "gradients differ by {worst}");
    let (e1, e2) = (candle.evaluate(&x, &y).unwrap(), rudra.evaluate(&x, &y).unwrap());
    assert_eq!(e1.1, e2.1, "the same predictions");
    assert!((e1.0 - e2.0).abs() < 1e-4, "summed loss: candle {}, Rudra {}", e1.0, e2.0);
}
