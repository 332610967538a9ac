//! Fuzz the frame reader the network uses, role check included: any bytes must give a
//! message or a clear error, never a panic. The first byte names the link's roles.
//!
//!     cargo +nightly fuzz run frame
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(inbound) = rudra_transport::reader::decode_fuzz_input(data) {
        // A payload view must be readable in full.
        if let rudra_transport::Inbound::Push { values, .. }
        | rudra_transport::Inbound::Weights { values, .. }
        | rudra_transport::Inbound::Center { values, .. } = &inbound
        {
            std::hint::black_box(values.iter().sum::<f32>());
        }
    }
});
