//! `training.init`: the initial weights of a model of the user's own (`training.model =
//! "external"`), a safetensors file such as `safetensors.torch.save_file(model.state_dict(), …)`
//! writes. Its tensors, in file order, make the flat parameter vector; their names and shapes are
//! the layout of the run's checkpoints, so a checkpoint loads back into the user's model.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rudra_compute::{ParamLayout, TensorInfo};
use safetensors::{Dtype, SafeTensors};

use crate::RuntimeError;

/// The largest model trained: 2³⁰ parameters (4 GiB of f32 per copy).
pub const MAX_PARAMS: u64 = 1 << 30;

/// The largest header a safetensors file has (its own limit).
const MAX_HEADER: u64 = 100 << 20;

/// An init file, read and checked.
#[derive(Clone, PartialEq)]
pub struct InitFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its tensors' names, shapes and ranges in the flat vector, in file order.
    pub layout: ParamLayout,
    /// The flat vector: every tensor's values as `f32`, in file order.
    pub params: Arc<Vec<f32>>,
}

impl std::fmt::Debug for InitFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tensors = self.layout.tensors.len();
        f.debug_struct("InitFile")
            .field("path", &self.path)
            .field("tensors", &tensors)
            .field("params", &self.layout.len)
            .finish()
    }
}

fn input(path: &Path, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Input { path: path.to_owned(), message: message.into() }
}

impl InitFile {
    /// Read `path`: a regular file of at most [`MAX_PARAMS`] parameters, one or more tensors of
    /// `F32`, `F64`, `F16` or `BF16` (converted to `f32`), every value finite.
    pub fn read(path: &Path) -> Result<Self, RuntimeError> {
        let meta =
            std::fs::metadata(path).map_err(|e| input(path, format!("cannot read the init file: {e}")))?;
        if !meta.is_file() {
            return Err(input(path, "is not a regular file; give training.init a safetensors file"));
        }
        if meta.len() > MAX_PARAMS * 8 + MAX_HEADER {
            return Err(input(
                path,
                format!("is {} bytes, more than a model of {MAX_PARAMS} parameters", meta.len()),
            ));
        }
        let bytes =
            std::fs::read(path).map_err(|e| input(path, format!("cannot read the init file: {e}")))?;
        let not_safetensors = |e: safetensors::SafeTensorError| {
            input(path, format!("is not a safetensors file ({e}); write it with safetensors' save_file"))
        };
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(not_safetensors)?;
        let file = SafeTensors::deserialize(&bytes).map_err(not_safetensors)?;
        let mut tensors = Vec::new();
        let mut params = Vec::new();
        for name in header.offset_keys() {
            let view = file.tensor(&name).map_err(not_safetensors)?;
            let start = params.len();
            let data = view.data();
            match view.dtype() {
                Dtype::F32 => {
                    params.extend(data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                }
                Dtype::F64 => params
                    .extend(data.chunks_exact(8).map(|b| {
                        f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
                    })),
                Dtype::F16 => {
                    params.extend(
                        data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
                    );
                }
                Dtype::BF16 => {
                    params.extend(
                        data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
                    );
                }
                other => {
                    return Err(input(
                        path,
                        format!(
                            "tensor {name} is {other:?}; the weights must be floating point (F32, F64, F16, BF16)"
                        ),
                    ));
                }
            }
            if let Some(bad) = params[start..].iter().position(|v| !v.is_finite()) {
                return Err(input(path, format!("tensor {name} holds a non-finite value at {bad}")));
            }
            tensors.push(TensorInfo { name, shape: view.shape().to_vec(), range: start..params.len() });
        }
        if params.is_empty() {
            return Err(input(path, "holds no weights; save the model's parameters into it"));
        }
        if params.len() as u64 > MAX_PARAMS {
            return Err(input(path, format!("holds {} weights, more than {MAX_PARAMS}", params.len())));
        }
        let layout = ParamLayout { len: params.len(), tensors };
        Ok(Self { path: path.to_owned(), layout, params: Arc::new(params) })
    }
}

#[cfg(test)]
mod tests {
    use safetensors::tensor::TensorView;

    use super::*;

    fn write(dir: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> PathBuf {
        let views = tensors
            .iter()
            .map(|(n, d, s, b)| ((*n).to_owned(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect::<Vec<_>>();
        let path = dir.join("init.safetensors");
        std::fs::write(&path, safetensors::tensor::serialize(views, None).unwrap()).unwrap();
        path
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn tensors_in_file_order_make_the_flat_vector() {
        let dir = tempfile::tempdir().unwrap();
        let f64s: Vec<u8> = [5.0f64, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        // safetensors stores wider types first, so the F64 tensor comes first in the file,
        // against the order of the names.
        let path = write(
            dir.path(),
            &[
                ("a.weight", Dtype::F32, vec![2, 2], f32s(&[1.0, 2.0, 3.0, 4.0])),
                ("z.bias", Dtype::F64, vec![2], f64s),
            ],
        );
        let init = InitFile::read(&path).unwrap();
        assert_eq!(*init.params, vec![5.0, 6.0, 1.0, 2.0, 3.0, 4.0]);
        let names: Vec<_> = init.layout.tensors.iter().map(|t| (t.name.as_str(), t.range.clone())).collect();
        assert_eq!(names, vec![("z.bias", 0..2), ("a.weight", 2..6)]);
        assert_eq!(init.layout.tensors[1].shape, vec![2, 2]);
    }

    #[test]
    fn integers_non_finite_values_and_other_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), &[("step", Dtype::I64, vec![1], vec![0; 8])]);
        assert!(InitFile::read(&path).unwrap_err().to_string().contains("floating point"));
        let path = write(dir.path(), &[("w", Dtype::F32, vec![2], f32s(&[1.0, f32::NAN]))]);
        assert!(InitFile::read(&path).unwrap_err().to_string().contains("non-finite value at 1"));
        let path = dir.path().join("junk");
        std::fs::write(&path, b"not a safetensors file").unwrap();
        assert!(InitFile::read(&path).unwrap_err().to_string().contains("is not a safetensors file"));
        assert!(InitFile::read(dir.path()).unwrap_err().to_string().contains("not a regular file"));
    }
}
