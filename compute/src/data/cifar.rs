//! CIFAR-10 in its standard binary version: `data_batch_1.bin` … `data_batch_5.bin` and
//! `test_batch.bin`, each a sequence of 3073-byte records: the label (0–9), then the 32×32
//! red, green and blue planes row by row. Images are returned channels-last (`y, x, channel`),
//! the layout of Rudra's convolutions.

use std::io::Read;
use std::path::Path;

use super::Dataset;
use crate::ComputeError;

/// Side of a CIFAR-10 image.
const SIDE: usize = 32;
/// Pixels per plane.
const PLANE: usize = SIDE * SIDE;
/// Bytes per record: the label and three planes.
const RECORD: usize = 1 + 3 * PLANE;
/// Number of classes.
const CLASSES: usize = 10;

/// The training files, in order.
const TRAIN_FILES: [&str; 5] =
    ["data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"];
/// The test file.
const TEST_FILE: &str = "test_batch.bin";

/// The largest CIFAR-10 batch file read (the real ones hold 30 MB).
const MAX_FILE_BYTES: u64 = 1 << 30;

/// Append the records of the file at `path` to `x` (channels-last, scaled to `[0, 1]`) and `y`.
fn read_batch(path: &Path, x: &mut Vec<f32>, y: &mut Vec<u8>) -> Result<(), ComputeError> {
    let mut bytes = Vec::new();
    super::open_regular(path, MAX_FILE_BYTES)?
        .read_to_end(&mut bytes)
        .map_err(|source| ComputeError::Io { path: path.to_owned(), source })?;
    let bad = |reason: String| ComputeError::Format { path: path.to_owned(), reason };
    if bytes.is_empty() || !bytes.len().is_multiple_of(RECORD) {
        return Err(bad(format!(
            "{} bytes is not a whole number of {RECORD}-byte CIFAR-10 records (a label byte and 3×32×32 pixels); \
             use the binary version of the dataset",
            bytes.len()
        )));
    }
    x.reserve(bytes.len() / RECORD * 3 * PLANE);
    for (i, record) in bytes.chunks_exact(RECORD).enumerate() {
        let label = record[0];
        if usize::from(label) >= CLASSES {
            return Err(bad(format!("record {i} has label {label}; CIFAR-10 labels are 0 to 9")));
        }
        y.push(label);
        let planes = &record[1..];
        for p in 0..PLANE {
            x.extend((0..3).map(|c| f32::from(planes[c * PLANE + p]) / 255.0));
        }
    }
    Ok(())
}

fn read_set(dir: &Path, files: &[&str]) -> Result<Dataset, ComputeError> {
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for f in files {
        read_batch(&dir.join(f), &mut x, &mut y)?;
    }
    Dataset::new(3 * PLANE, CLASSES, x, y)
}

/// CIFAR-10 from a directory holding the binary version's files: `(train, test)`.
pub fn load_cifar10(dir: &Path) -> Result<(Dataset, Dataset), ComputeError> {
    Ok((read_set(dir, &TRAIN_FILES)?, read_set(dir, &[TEST_FILE])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record whose red plane is `r`, green `g` and blue the pixel index (mod 256).
    fn record(label: u8, r: u8, g: u8) -> Vec<u8> {
        let mut v = vec![label];
        v.extend(std::iter::repeat_n(r, PLANE));
        v.extend(std::iter::repeat_n(g, PLANE));
        v.extend((0..PLANE).map(|p| p as u8));
        v
    }

    fn write_all(dir: &Path, per_file: usize) {
        for (f, name) in TRAIN_FILES.iter().chain([&TEST_FILE]).enumerate() {
            let bytes: Vec<u8> =
                (0..per_file).flat_map(|i| record(((f + i) % 10) as u8, 255, (10 * f) as u8)).collect();
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }

    #[test]
    fn reads_the_binary_format_channels_last() {
        let dir = tempfile::tempdir().unwrap();
        write_all(dir.path(), 3);
        let (train, test) = load_cifar10(dir.path()).unwrap();
        assert_eq!((train.len(), test.len(), train.features(), train.classes()), (15, 3, 3072, 10));
        let (mut x, mut y) = (Vec::new(), Vec::new());
        train.gather(&[4], &mut x, &mut y);
        // Example 4 is the second record of data_batch_2.bin: label (1 + 1) % 10, green 10.
        assert_eq!(y, [2]);
        let pixel = 33; // row 1, column 1
        assert_eq!(&x[3 * pixel..3 * pixel + 3], &[1.0, 10.0 / 255.0, 33.0 / 255.0]);
        test.gather(&[2], &mut x, &mut y);
        assert_eq!(y, [7], "the third record of test_batch.bin: label 5 + 2");
    }

    #[test]
    fn bad_files_are_errors_that_name_them() {
        let dir = tempfile::tempdir().unwrap();
        write_all(dir.path(), 2);
        let named = |e: ComputeError, file: &str| match e {
            ComputeError::Format { path, reason } if path.ends_with(file) => reason,
            other => panic!("expected a format error naming {file}, got {other}"),
        };
        std::fs::write(dir.path().join("data_batch_3.bin"), vec![0u8; RECORD + 1]).unwrap();
        let reason = named(load_cifar10(dir.path()).unwrap_err(), "data_batch_3.bin");
        assert!(reason.contains("3073-byte"), "{reason}");
        std::fs::write(dir.path().join("data_batch_3.bin"), record(10, 0, 0)).unwrap();
        let reason = named(load_cifar10(dir.path()).unwrap_err(), "data_batch_3.bin");
        assert!(reason.contains("label 10"), "{reason}");
        std::fs::remove_file(dir.path().join("test_batch.bin")).unwrap();
        std::fs::write(dir.path().join("data_batch_3.bin"), record(1, 0, 0)).unwrap();
        assert!(
            matches!(load_cifar10(dir.path()), Err(ComputeError::Io { path, .. }) if path.ends_with("test_batch.bin"))
        );
    }
}
