//! The wgpu backend's stand-in when the `wgpu` feature is off.

unavailable_backend!(WgpuBackend, WgpuBuffer, "wgpu");

impl WgpuBackend {
    /// Whether the adapter renders in software.
    #[must_use]
    pub fn is_software(&self) -> bool {
        match self.0 {}
    }
}
