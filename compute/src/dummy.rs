//! Stand-ins for backends whose cargo feature is off: the same type names, uninhabited, so
//! [`Device`](crate::Device) has the same variants in every build and opening one of them
//! is an error that says how to build it.

/// Declare `$backend` and `$buffer` as uninhabited types and implement
/// [`Backend`](crate::Backend) for `$backend`.
macro_rules! unavailable_backend {
    ($backend:ident, $buffer:ident, $name:literal) => {
        #[doc = concat!("The ", $name, " backend, left out of this build (cargo feature `", $name, "`).")]
        #[derive(Clone, Debug)]
        pub struct $backend(std::convert::Infallible);

        #[doc = concat!("A buffer of the ", $name, " backend, left out of this build.")]
        pub struct $buffer(std::convert::Infallible);

        impl $backend {
            /// Always an error: the backend is not in this build.
            pub fn new() -> Result<Self, $crate::ComputeError> {
                Err($crate::ComputeError::Unavailable {
                    backend: $name,
                    reason: concat!("this build leaves it out; build with `--features ", $name, "`").into(),
                })
            }

            /// What the backend runs on.
            #[must_use]
            pub fn description(&self) -> String {
                match self.0 {}
            }
        }

        impl $crate::Backend for $backend {
            type Buffer = $buffer;

            fn name(&self) -> &'static str {
                $name
            }
            fn alloc(&self, _: usize) -> Result<$buffer, $crate::ComputeError> {
                match self.0 {}
            }
            fn write(&self, _: &mut $buffer, _: usize, _: &[f32]) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn read(&self, _: &$buffer, _: usize, _: &mut [f32]) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn gemm(
                &self,
                _: $crate::Gemm,
                _: (&$buffer, usize),
                _: (&$buffer, usize),
                _: (&mut $buffer, usize),
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn add_bias(
                &self,
                _: &mut $buffer,
                _: usize,
                _: usize,
                _: (&$buffer, usize),
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn relu(&self, _: &mut $buffer, _: usize) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn relu_backward(
                &self,
                _: &mut $buffer,
                _: &$buffer,
                _: usize,
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn sum_rows(
                &self,
                _: &$buffer,
                _: usize,
                _: usize,
                _: (&mut $buffer, usize),
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn softmax_cross_entropy(
                &self,
                _: &$buffer,
                _: &[u8],
                _: usize,
                _: &mut $buffer,
            ) -> Result<f32, $crate::ComputeError> {
                match self.0 {}
            }
            fn evaluate_logits(
                &self,
                _: &$buffer,
                _: &[u8],
                _: usize,
            ) -> Result<(f64, usize), $crate::ComputeError> {
                match self.0 {}
            }
            fn im2col(
                &self,
                _: $crate::Conv2d,
                _: &$buffer,
                _: &mut $buffer,
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn col2im(
                &self,
                _: $crate::Conv2d,
                _: &$buffer,
                _: &mut $buffer,
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn pool(
                &self,
                _: $crate::Pool2d,
                _: &$buffer,
                _: &mut $buffer,
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn pool_backward(
                &self,
                _: $crate::Pool2d,
                _: &$buffer,
                _: &$buffer,
                _: &mut $buffer,
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn axpy(
                &self,
                _: f32,
                _: &$buffer,
                _: &mut $buffer,
                _: usize,
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn momentum(
                &self,
                _: $crate::Rate,
                _: &$buffer,
                _: &mut $buffer,
                _: &mut $buffer,
                _: usize,
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn adamw(
                &self,
                _: $crate::Adam,
                _: &$buffer,
                _: (&mut $buffer, &mut $buffer),
                _: &mut $buffer,
                _: usize,
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn nesterov(
                &self,
                _: $crate::Rate,
                _: &$buffer,
                _: &mut $buffer,
                _: &mut $buffer,
                _: usize,
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
            fn elastic_pull(
                &self,
                _: f32,
                _: &$buffer,
                _: &mut $buffer,
                _: usize,
            ) -> Result<(), $crate::ComputeError> {
                match self.0 {}
            }
        }
    };
}
