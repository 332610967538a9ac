//! The IDX format of MNIST: `0 0 type ndims`, `ndims` big-endian u32 sizes, then the data.
//! Only unsigned-byte arrays (type `0x08`) are read; gzipped files are detected by magic.

use std::io::{BufReader, Read};
use std::path::Path;

use flate2::read::GzDecoder;

use crate::ComputeError;

/// Largest array read, to bound allocation on a corrupt header (4 GiB).
const MAX_BYTES: u64 = 4 << 30;

/// An unsigned-byte IDX array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdxArray {
    /// Sizes, outermost first.
    pub dims: Vec<usize>,
    /// The elements, row-major.
    pub data: Vec<u8>,
}

/// Read an IDX file of unsigned bytes, plain or gzipped.
pub fn read_idx(path: &Path) -> Result<IdxArray, ComputeError> {
    let io = |source| ComputeError::Io { path: path.to_owned(), source };
    let bad = |reason: String| ComputeError::Format { path: path.to_owned(), reason };
    let mut file = BufReader::new(super::open_regular(path, MAX_BYTES)?);
    let mut magic = [0u8; 4];
    let got = read_full(&mut file, &mut magic).map_err(io)?;
    if got < 4 {
        return Err(bad(format!("file is {got} bytes long, too short for an IDX header")));
    }
    let chained = std::io::Cursor::new(magic).chain(file);
    if magic[..2] == [0x1f, 0x8b] {
        parse(GzDecoder::new(chained), &bad, &io)
    } else {
        parse(chained, &bad, &io)
    }
}

fn parse(
    mut r: impl Read,
    bad: &dyn Fn(String) -> ComputeError,
    io: &dyn Fn(std::io::Error) -> ComputeError,
) -> Result<IdxArray, ComputeError> {
    let mut header = [0u8; 4];
    if read_full(&mut r, &mut header).map_err(io)? < 4 {
        return Err(bad("truncated: no complete IDX header".into()));
    }
    if header[..2] != [0, 0] {
        return Err(bad(format!("wrong magic {:02x}{:02x}, expected 0000", header[0], header[1])));
    }
    if header[2] != 0x08 {
        return Err(bad(format!("element type 0x{:02x} is not unsigned byte (0x08)", header[2])));
    }
    let ndims = usize::from(header[3]);
    if !(1..=4).contains(&ndims) {
        return Err(bad(format!("{ndims} dimensions; expected 1 to 4")));
    }
    let mut dims = Vec::with_capacity(ndims);
    for _ in 0..ndims {
        let mut d = [0u8; 4];
        if read_full(&mut r, &mut d).map_err(io)? < 4 {
            return Err(bad("truncated inside the dimension list".into()));
        }
        dims.push(u32::from_be_bytes(d) as usize);
    }
    let total = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64)).filter(|&t| t <= MAX_BYTES);
    let Some(total) = total else {
        return Err(bad(format!("dimensions {dims:?} exceed the {MAX_BYTES}-byte limit")));
    };
    let mut data = vec![0u8; total as usize];
    let got = read_full(&mut r, &mut data).map_err(io)?;
    if got < data.len() {
        return Err(bad(format!("truncated: dimensions {dims:?} need {total} data bytes, found {got}")));
    }
    if read_full(&mut r, &mut [0u8; 1]).map_err(io)? != 0 {
        return Err(bad(format!("trailing bytes after the {total} data bytes of dimensions {dims:?}")));
    }
    Ok(IdxArray { dims, data })
}

/// Read until `buf` is full or the input ends; returns how many bytes were read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::{Compression, write::GzEncoder};

    use super::*;

    fn idx_bytes(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut v = vec![0, 0, 8, dims.len() as u8];
        for d in dims {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v.extend_from_slice(data);
        v
    }

    fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn reason(path: &Path) -> String {
        match read_idx(path) {
            Err(ComputeError::Format { path: p, reason }) => {
                assert_eq!(p, path, "the error names the file");
                reason
            }
            other => panic!("expected a format error, got {other:?}"),
        }
    }

    #[test]
    fn reads_plain_and_gzipped_arrays() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = idx_bytes(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        let plain = write(&dir, "a", &bytes);
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&bytes).unwrap();
        let zipped = write(&dir, "a.gz", &gz.finish().unwrap());
        for p in [plain, zipped] {
            let a = read_idx(&p).unwrap();
            assert_eq!(a.dims, vec![2, 3]);
            assert_eq!(a.data, vec![1, 2, 3, 4, 5, 6]);
        }
    }

    #[test]
    fn corrupt_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let truncated = write(&dir, "t", &idx_bytes(&[2, 3], &[1, 2, 3]));
        assert!(reason(&truncated).contains("truncated"));
        let mut wrong = idx_bytes(&[1], &[0]);
        wrong[0] = 0x42;
        assert!(reason(&write(&dir, "m", &wrong)).contains("magic"));
        let mut float = idx_bytes(&[1], &[0, 0, 0, 0]);
        float[2] = 0x0d;
        assert!(reason(&write(&dir, "f", &float)).contains("element type"));
        assert!(reason(&write(&dir, "s", &[0, 0])).contains("too short"));
        assert!(reason(&write(&dir, "x", &idx_bytes(&[1], &[1, 2]))).contains("trailing"));
        let huge = write(&dir, "h", &idx_bytes(&[u32::MAX, u32::MAX], &[]));
        assert!(reason(&huge).contains("limit"));
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&idx_bytes(&[4], &[1, 2, 3, 4])).unwrap();
        let mut cut = gz.finish().unwrap();
        cut.truncate(cut.len() / 2);
        assert!(read_idx(&write(&dir, "c.gz", &cut)).is_err());
        assert!(matches!(read_idx(&dir.path().join("missing")), Err(ComputeError::Io { .. })));
    }
}
