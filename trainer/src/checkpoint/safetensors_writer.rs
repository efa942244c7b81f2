//! A streaming safetensors writer: the bytes go from each CPU tensor's memory to the
//! file and, in the same pass, to a sha256 hasher. There is no copy of a tensor or of
//! the file in memory, and no second read of the file for its digest.
//!
//! The layout is the `safetensors` crate's (the version tch reads and writes): the
//! header's length (8 bytes, little-endian), the JSON header, padded with spaces to a
//! multiple of 8, then every tensor's bytes in header order. The header lists the
//! tensors by descending dtype, then by name, each as the crate's own [`TensorInfo`]
//! serialized by serde_json, which is how the crate writes it. The tests check that the
//! files are byte-identical to tch's `Tensor::write_safetensors` and read back through
//! `safetensors`, tch and the checkpoint loader.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use safetensors::tensor::{Dtype, TensorInfo};
use serde::Serializer;
use sha2::{Digest, Sha256};
use tch::{Device, Tensor};

use crate::Error;

/// Bytes per hash update and per write. A big tensor goes out in few system calls, and
/// each chunk is still in cache when the write copies it after hashing.
const CHUNK: usize = 1 << 20;

/// The size and sha256 of a written file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub bytes: u64,
    pub sha256: [u8; 32],
}

/// One tensor to write: a contiguous CPU tensor (the caller's, or a copy when it was
/// not one) and its header entry.
struct Entry<'a> {
    name: &'a str,
    tensor: Tensor,
    info: TensorInfo,
}

/// Writes `tensors` as a safetensors file at `path` (created, or truncated), fsyncs it
/// and returns its size and sha256. A tensor not on the CPU or not contiguous is copied
/// first; the others are read in place, and must not change until this returns.
pub fn write_synced(path: &Path, tensors: &[(String, Tensor)]) -> Result<Written, Error> {
    let fail = |message: String| Error::Checkpoint { path: path.to_path_buf(), message };
    let entries = entries(tensors).map_err(fail)?;
    let header = header(&entries).map_err(fail)?;
    let file = File::create(path).map_err(|e| fail(format!("cannot create it: {e}")))?;
    let mut out = Hashed { file: BufWriter::with_capacity(CHUNK, file), hasher: Sha256::new(), bytes: 0 };
    out.write_all(&entries, &header).map_err(|e| fail(format!("cannot write it: {e}")))?;
    out.finish().map_err(|e| fail(format!("cannot write it: {e}")))
}

/// The file being written, and the hash and count of what went into it.
struct Hashed {
    file: BufWriter<File>,
    hasher: Sha256,
    bytes: u64,
}

impl Hashed {
    /// The header's length, the header, then every tensor's bytes.
    fn write_all(&mut self, entries: &[Entry<'_>], header: &[u8]) -> io::Result<()> {
        self.write(&(header.len() as u64).to_le_bytes())?;
        self.write(header)?;
        for entry in entries {
            for chunk in bytes(&entry.tensor).chunks(CHUNK) {
                self.write(chunk)?;
            }
        }
        Ok(())
    }

    fn write(&mut self, chunk: &[u8]) -> io::Result<()> {
        self.hasher.update(chunk);
        self.bytes += chunk.len() as u64;
        self.file.write_all(chunk)
    }

    /// Flushes and fsyncs the file.
    fn finish(self) -> io::Result<Written> {
        let file = self.file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(Written { bytes: self.bytes, sha256: self.hasher.finalize().into() })
    }
}

/// The tensors in file order (descending dtype, then name, as `safetensors` sorts them),
/// each contiguous on the CPU, with its header entry and offsets.
fn entries(tensors: &[(String, Tensor)]) -> Result<Vec<Entry<'_>>, String> {
    let mut names = HashSet::new();
    let mut entries = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if !names.insert(name.as_str()) {
            return Err(format!("tensor {name} is given twice"));
        }
        let problem = |e: tch::TchError| format!("tensor {name}: {e}");
        if t.is_sparse() {
            return Err(format!("tensor {name}: sparse tensors cannot be saved"));
        }
        let dtype = Dtype::try_from(t.kind()).map_err(problem)?;
        let tensor = if t.device() == Device::Cpu && t.is_contiguous() {
            t.shallow_clone()
        } else {
            t.f_to_device(Device::Cpu).and_then(|c| c.f_contiguous()).map_err(problem)?
        };
        let shape = tensor.size().iter().map(|&d| d as usize).collect();
        entries.push(Entry { name, tensor, info: TensorInfo { dtype, shape, data_offsets: (0, 0) } });
    }
    entries.sort_by(|a, b| b.info.dtype.cmp(&a.info.dtype).then(a.name.cmp(b.name)));
    let mut offset = 0;
    for entry in &mut entries {
        let end = offset + bytes(&entry.tensor).len();
        entry.info.data_offsets = (offset, end);
        offset = end;
    }
    Ok(entries)
}

/// The JSON header, padded with spaces to a multiple of 8 bytes.
fn header(entries: &[Entry<'_>]) -> Result<Vec<u8>, String> {
    let mut json = Vec::new();
    serde_json::Serializer::new(&mut json)
        .collect_map(entries.iter().map(|e| (e.name, &e.info)))
        .map_err(|e| format!("cannot encode the safetensors header: {e}"))?;
    json.resize(json.len().next_multiple_of(8), b' ');
    Ok(json)
}

/// The bytes of a contiguous CPU tensor, in place.
fn bytes(t: &Tensor) -> &[u8] {
    assert!(t.device() == Device::Cpu && t.is_contiguous(), "only a contiguous CPU tensor has its bytes in place");
    let len = t.numel() * t.kind().elt_size_in_bytes();
    if len == 0 {
        // An empty tensor's data pointer may be null, which a slice may not be.
        return &[];
    }
    // SAFETY: `t` is a contiguous CPU tensor (asserted above), so its `len` bytes start at
    // its data pointer and stay allocated while `t` is borrowed; nothing writes them while
    // a checkpoint is written (the writer's copies are its own; a synchronous save's
    // caller is blocked).
    unsafe { std::slice::from_raw_parts(t.data_ptr() as *const u8, len) }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use tch::Kind;

    use super::*;
    use crate::files::test_util::TempDir;

    /// f32 (with -0.0, NaN, a subnormal), bf16, i64, a scalar, an empty tensor, a
    /// non-contiguous view and names out of order, so that sorting and padding matter.
    fn tensors() -> Vec<(String, Tensor)> {
        let f32s = Tensor::from_slice(&[1.5f32, -0.0, f32::NAN, 1e-40, -7.25, 3.0e38]).reshape([2, 3]);
        let bf16 = Tensor::from_slice(&[0.1f32, -2.5, 65504.0]).to_kind(Kind::BFloat16);
        let i64s = Tensor::from_slice(&[i64::MIN, -1, 0, i64::MAX]);
        let transposed = Tensor::arange(12, (Kind::Float, Device::Cpu)).reshape([3, 4]).transpose(0, 1);
        vec![
            ("model.z.weight".into(), f32s),
            ("b.bf16".into(), bf16),
            ("a.steps".into(), i64s),
            ("scalar".into(), Tensor::from(2.5f32)),
            ("empty".into(), Tensor::zeros([0, 4], (Kind::Float, Device::Cpu))),
            ("empty.i64".into(), Tensor::zeros([0], (Kind::Int64, Device::Cpu))),
            ("transposed".into(), transposed),
            ("m\u{e9}\"quoted\\".into(), Tensor::from_slice(&[7u8, 8, 9])),
        ]
    }

    /// Same kind, shape and bits (NaN included).
    fn same(a: &Tensor, b: &Tensor) -> bool {
        a.kind() == b.kind() && a.size() == b.size() && bytes(&a.contiguous()) == bytes(&b.contiguous())
    }

    #[test]
    fn bytes_equal_tchs_writer_and_the_digest_is_the_files() {
        let dir = TempDir::new("identical");
        let ours = dir.0.join("ours.safetensors");
        let theirs = dir.0.join("tch.safetensors");
        let written = write_synced(&ours, &tensors()).unwrap();
        // tch refuses a non-contiguous tensor; give it the contiguous copy we write.
        let contiguous: Vec<(String, Tensor)> = tensors().into_iter().map(|(n, t)| (n, t.contiguous())).collect();
        Tensor::write_safetensors(&contiguous, &theirs).unwrap();
        let (ours_bytes, theirs_bytes) = (fs::read(&ours).unwrap(), fs::read(&theirs).unwrap());
        assert_eq!(ours_bytes, theirs_bytes);
        let header_len = u64::from_le_bytes(ours_bytes[..8].try_into().unwrap());
        assert_eq!(header_len % 8, 0, "the header is padded to a multiple of 8 bytes");
        let digest = crate::checkpoint::sha256_file(&ours).unwrap();
        assert_eq!(written.bytes, digest.bytes);
        assert_eq!(crate::checkpoint::hex(&written.sha256), digest.sha256);
        assert_eq!(written.sha256, <[u8; 32]>::from(Sha256::digest(&ours_bytes)));
    }

    #[test]
    fn every_padding_matches_tchs_writer() {
        let dir = TempDir::new("padding");
        let mut paddings = HashSet::new();
        for len in 1..=8 {
            let one = vec![("w".repeat(len), Tensor::from_slice(&[1f32, 2.0]))];
            let (ours, theirs) = (dir.0.join(format!("ours-{len}")), dir.0.join(format!("tch-{len}")));
            write_synced(&ours, &one).unwrap();
            Tensor::write_safetensors(&one, &theirs).unwrap();
            let bytes = fs::read(&ours).unwrap();
            assert_eq!(bytes, fs::read(&theirs).unwrap(), "name of {len} bytes");
            let header = &bytes[8..8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize];
            paddings.insert(header.iter().rev().take_while(|&&b| b == b' ').count());
        }
        assert_eq!(paddings.len(), 8, "each of 0 to 7 spaces of padding: {paddings:?}");
    }

    #[test]
    fn reads_back_through_safetensors_tch_and_the_loader() {
        let dir = TempDir::new("roundtrip");
        let path = dir.0.join("model.safetensors");
        let expected = tensors();
        write_synced(&path, &expected).unwrap();

        let raw = fs::read(&path).unwrap();
        let parsed = safetensors::SafeTensors::deserialize(&raw).unwrap();
        assert_eq!(parsed.len(), expected.len());
        let scalar = parsed.tensor("scalar").unwrap();
        assert_eq!((scalar.dtype(), scalar.shape(), scalar.data()), (Dtype::F32, &[][..], &2.5f32.to_le_bytes()[..]));
        assert_eq!(parsed.tensor("empty").unwrap().shape(), &[0, 4]);
        assert_eq!(parsed.tensor("b.bf16").unwrap().dtype(), Dtype::BF16);

        let by_tch: std::collections::HashMap<_, _> = Tensor::read_safetensors(&path).unwrap().into_iter().collect();
        let by_loader = crate::checkpoint::load_weights(&path).unwrap();
        for (name, t) in &expected {
            assert!(same(&by_tch[name], t), "{name} through tch");
            assert!(same(&by_loader[name], t), "{name} through load_weights");
        }
        assert_eq!(by_loader.len(), expected.len());
    }

    #[test]
    fn an_empty_list_is_a_valid_file() {
        let dir = TempDir::new("none");
        let path = dir.0.join("empty.safetensors");
        let written = write_synced(&path, &[]).unwrap();
        let raw = fs::read(&path).unwrap();
        assert_eq!(written.bytes, raw.len() as u64);
        assert!(safetensors::SafeTensors::deserialize(&raw).unwrap().is_empty());
    }

    #[test]
    fn errors_name_the_file() {
        let dir = TempDir::new("errors");
        let missing = dir.0.join("no-such-dir").join("model.safetensors");
        match write_synced(&missing, &tensors()) {
            Err(Error::Checkpoint { path, message }) => {
                assert_eq!(path, missing);
                assert!(message.contains("cannot create it"), "{message}");
            }
            other => panic!("expected a checkpoint error, got {other:?}"),
        }
        let twice = vec![("w".to_string(), Tensor::from(1f32)), ("w".to_string(), Tensor::from(2f32))];
        let path = dir.0.join("twice.safetensors");
        match write_synced(&path, &twice) {
            Err(e @ Error::Checkpoint { .. }) => assert!(e.to_string().contains("twice.safetensors"), "{e}"),
            other => panic!("expected a checkpoint error, got {other:?}"),
        }
        // A path that is a directory, which even root cannot create as a file.
        let taken = dir.0.join("taken.safetensors");
        fs::create_dir(&taken).unwrap();
        match write_synced(&taken, &tensors()) {
            Err(e @ Error::Checkpoint { .. }) => assert!(e.to_string().contains(&*taken.to_string_lossy()), "{e}"),
            other => panic!("expected a checkpoint error, got {other:?}"),
        }
        // A read-only directory refuses the file, unless we are root, whom it does not stop.
        let readonly = dir.0.join("readonly");
        fs::create_dir(&readonly).unwrap();
        fs::set_permissions(&readonly, fs::Permissions::from_mode(0o555)).unwrap();
        let path = readonly.join("model.safetensors");
        if File::create(readonly.join("probe")).is_err() {
            match write_synced(&path, &tensors()) {
                Err(e @ Error::Checkpoint { .. }) => assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}"),
                other => panic!("expected a checkpoint error, got {other:?}"),
            }
        }
        fs::set_permissions(&readonly, fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn a_full_disk_still_reads_as_storage_full() {
        let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let err = Error::Checkpoint { path: "x".into(), message: format!("cannot write it: {e}") };
        assert_eq!(err.reason(), Some(crds::contract::FailureReason::StorageFull));
    }
}
