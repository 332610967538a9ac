//! [`GradientModel`]: what a learner needs of a model, so a model of your own can train in a
//! Rudra cluster.

use std::sync::Arc;

use crate::{Backend, Batch, ComputeError, Dataset, Model};

/// A model a learner can train: parameters in one flat vector, written by the shards, and the
/// loss and gradient of a minibatch of labelled examples.
///
/// [`Model`] implements it on every [`Backend`]. A model of your own implements the required
/// methods; its parameter vector is split among the shards by plain ranges, so any layout works
/// as long as [`GradientModel::param_count`] is fixed.
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

    /// Summed loss and the number of examples classified correctly over the batch `x` at the
    /// current parameters (no gradient): how a run's test accuracy is measured.
    fn evaluate(&mut self, x: &[f32], labels: &[u8]) -> Result<(f64, usize), ComputeError>;

    /// [`GradientModel::evaluate`] summed over all of `data`, `chunk` examples at a time.
    fn evaluate_dataset(&mut self, data: &Dataset, chunk: usize) -> Result<(f64, usize), ComputeError> {
        data.chunks(chunk.max(1)).try_fold((0.0, 0), |(loss, correct), (x, y)| {
            let (l, c) = self.evaluate(x, y)?;
            Ok((loss + l, correct + c))
        })
    }

    /// Mean loss and accuracy over all of `data`, evaluated `chunk` examples at a time.
    fn evaluate_set(&mut self, data: &Dataset, chunk: usize) -> Result<(f64, f64), ComputeError> {
        let (loss, correct) = self.evaluate_dataset(data, chunk)?;
        let n = data.len().max(1) as f64;
        Ok((loss / n, correct as f64 / n))
    }

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

    /// The model's own evaluation of `params`, for a run whose scheduler cannot evaluate the
    /// model itself (an external model's): `(mean loss, accuracy)`, or `None`, the default, for
    /// a model without one. `last`: these are the run's final weights.
    fn evaluate_weights(
        &mut self,
        params: &Arc<Vec<f32>>,
        last: bool,
    ) -> Result<Option<(f64, f64)>, ComputeError> {
        let _ = (params, last);
        Ok(None)
    }

    /// The loss and gradient a learner computes for one step: on `batch`, at `params` (a whole
    /// vector shared with a shard) or at the model's own parameters. The default computes on
    /// the batch's examples; a model whose examples are held elsewhere reads its indices.
    fn gradient_on(&mut self, params: Option<&Arc<Vec<f32>>>, batch: Batch<'_>) -> Result<f32, ComputeError> {
        match params {
            Some(params) => self.loss_and_gradient_at(params, batch.x, batch.labels),
            None => self.loss_and_gradient(batch.x, batch.labels),
        }
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

    fn evaluate(&mut self, x: &[f32], labels: &[u8]) -> Result<(f64, usize), ComputeError> {
        Model::evaluate(self, x, labels)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CpuBackend, ModelSpec};

    /// `½|θ|²` whatever the batch: its gradient is θ.
    struct Quadratic(Vec<f32>);

    impl GradientModel for Quadratic {
        fn param_count(&self) -> usize {
            self.0.len()
        }
        fn write_params(&mut self, offset: usize, values: &[f32]) -> Result<(), ComputeError> {
            let dst = self.0.get_mut(offset..offset + values.len());
            dst.ok_or_else(|| ComputeError::Shape("out of range".into()))?.copy_from_slice(values);
            Ok(())
        }
        fn loss_and_gradient(&mut self, _: &[f32], _: &[u8]) -> Result<f32, ComputeError> {
            Ok(self.0.iter().map(|v| v * v).sum::<f32>() / 2.0)
        }
        fn take_gradient(&mut self, out: &mut Vec<f32>) -> Result<(), ComputeError> {
            out.copy_from_slice(&self.0);
            Ok(())
        }
        fn evaluate(&mut self, x: &[f32], _: &[u8]) -> Result<(f64, usize), ComputeError> {
            Ok((x.len() as f64, 0))
        }
    }

    #[test]
    fn the_default_shared_parameter_path_writes_them_first_and_checks_their_length() {
        let mut q = Quadratic(vec![0.0; 3]);
        let loss = q.loss_and_gradient_at(&Arc::new(vec![1.0, 2.0, 2.0]), &[], &[]).unwrap();
        let mut grad = vec![0.0; 3];
        q.take_gradient(&mut grad).unwrap();
        assert_eq!((loss, grad), (4.5, vec![1.0, 2.0, 2.0]));
        assert!(q.loss_and_gradient_at(&Arc::new(vec![1.0; 4]), &[], &[]).is_err());
    }

    #[test]
    fn a_model_through_the_trait_computes_what_it_computes_directly() {
        let spec = ModelSpec::dense(3, vec![], 2);
        let params = Arc::new(spec.init(4));
        let (x, y) = ([0.5, -1.0, 2.0, 0.0, 1.0, 1.0], [1, 0]);
        let mut direct = Model::new(CpuBackend, spec.clone()).unwrap();
        let expected = direct.loss_and_gradient_at(&params, &x, &y).unwrap();
        let mut model: Box<dyn GradientModel> = Box::new(Model::new(CpuBackend, spec).unwrap());
        assert_eq!(model.param_count(), params.len());
        assert_eq!(model.loss_and_gradient_at(&params, &x, &y).unwrap(), expected);
    }
}
