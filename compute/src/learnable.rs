//! [`GradientModel`]: what a learner needs of a model, so a model of your own can train in a
//! Rudra cluster.

use std::sync::Arc;

use crate::{Backend, ComputeError, Model};

/// A model a learner can train: parameters in one flat vector, written by the shards, and the
/// loss and gradient of a minibatch of labelled examples.
///
/// [`Model`] implements it on every [`Backend`]. A model of your own implements the three
/// required methods; its parameter vector is split among the shards by plain ranges, so any
/// layout works as long as [`GradientModel::param_count`] is fixed.
pub trait GradientModel: Send + 'static {
    /// Length of the flat parameter vector (and of every gradient).
    fn param_count(&self) -> usize;

    /// Overwrite parameters `offset..offset + values.len()`; an error if that range does not
    /// lie within the vector.
    fn write_params(&mut self, offset: usize, values: &[f32]) -> Result<(), ComputeError>;

    /// Mean loss over the minibatch `x` (`labels.len()` rows, row-major) at the current
    /// parameters; the gradient is kept for [`GradientModel::take_gradient`].
    fn loss_and_gradient(&mut self, x: &[f32], labels: &[u8]) -> Result<f32, ComputeError>;

    /// Move the last gradient into `out`, a vector of [`GradientModel::param_count`] values.
    fn take_gradient(&mut self, out: &mut Vec<f32>) -> Result<(), ComputeError>;

    /// [`GradientModel::loss_and_gradient`] at `params`, a whole parameter vector shared with
    /// a shard. The default copies it in; a model over host memory can read it in place.
    fn loss_and_gradient_at(
        &mut self,
        params: &Arc<Vec<f32>>,
        x: &[f32],
        labels: &[u8],
    ) -> Result<f32, ComputeError> {
        if params.len() != self.param_count() {
            return Err(ComputeError::Shape(format!(
                "{} parameters for a model of {}",
                params.len(),
                self.param_count()
            )));
        }
        self.write_params(0, params)?;
        self.loss_and_gradient(x, labels)
    }
}

impl<B: Backend> GradientModel for Model<B> {
    fn param_count(&self) -> usize {
        self.layout().len
    }

    fn write_params(&mut self, offset: usize, values: &[f32]) -> Result<(), ComputeError> {
        Model::write_params(self, offset, values)
    }

    fn loss_and_gradient(&mut self, x: &[f32], labels: &[u8]) -> Result<f32, ComputeError> {
        Model::loss_and_gradient(self, x, labels)
    }

    fn take_gradient(&mut self, out: &mut Vec<f32>) -> Result<(), ComputeError> {
        Model::take_gradient(self, out)
    }

    fn loss_and_gradient_at(
        &mut self,
        params: &Arc<Vec<f32>>,
        x: &[f32],
        labels: &[u8],
    ) -> Result<f32, ComputeError> {
        Model::loss_and_gradient_at(self, params, x, labels)
    }
}
