//! The CUDA backend's stand-in when the `cuda` feature is off.

unavailable_backend!(CudaBackend, CudaBuffer, "cuda");
