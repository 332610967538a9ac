//! The fuzzers' seed corpus (`fuzz/corpus/frame/`) is current: every file is a valid frame of
//! this wire version on a link that accepts it, and together they hold every message kind.

use std::collections::BTreeSet;
use std::path::Path;

use rudra_transport::Kind;
use rudra_transport::reader::decode_fuzz_input;

#[test]
fn the_seed_corpus_holds_a_valid_frame_of_every_kind() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/frame");
    let regenerate = "regenerate it with `cargo run --manifest-path fuzz/Cargo.toml --bin seeds`";
    let mut kinds = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}; {regenerate}", dir.display())) {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let frame = decode_fuzz_input(&bytes)
            .unwrap_or_else(|e| panic!("{} is not a valid frame ({e}); {regenerate}", path.display()));
        kinds.insert(frame.kind() as u16);
    }
    let every: BTreeSet<u16> = (1..).map_while(|k| Kind::from_u16(k).map(|k| k as u16)).collect();
    assert_eq!(kinds, every, "kinds missing from the corpus; {regenerate}");
}
