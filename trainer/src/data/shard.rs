//! Token shards: a versioned 128-byte header and the tokens of whole documents, each
//! followed by EOS, read through mmap. A per-source [`Manifest`] lists the shards.
//!
//! Header (little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `PTSHARD\0` |
//! | 8..12 | format version (1) |
//! | 12..16 | bytes per token: 2 (u16, vocab < 65536) or 4 (u32) |
//! | 16..24 | token count |
//! | 24..32 | document count (EOS tokens) |
//! | 32..36 | CRC-32 of the token bytes |
//! | 36..40 | EOS id |
//! | 40..104 | tokenizer hash (64 ASCII hex digits, [`Tokenizer::hash`](super::Tokenizer::hash)) |
//! | 104..128 | zero |

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;

pub const MAGIC: &[u8; 8] = b"PTSHARD\0";
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: usize = 128;
/// The manifest's file name in a prepared source directory.
pub const MANIFEST: &str = "manifest.json";

/// Token width on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    U16,
    U32,
}

impl Dtype {
    /// u16 when every id fits.
    pub fn for_vocab(vocab_size: usize) -> Dtype {
        if vocab_size <= 1 << 16 { Dtype::U16 } else { Dtype::U32 }
    }

    pub fn bytes(self) -> usize {
        match self {
            Dtype::U16 => 2,
            Dtype::U32 => 4,
        }
    }
}

/// What a shard's header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub dtype: Dtype,
    pub tokens: u64,
    pub documents: u64,
    pub crc32: u32,
    pub eos_id: u32,
    pub tokenizer_hash: String,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[0..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(self.dtype.bytes() as u32).to_le_bytes());
        h[16..24].copy_from_slice(&self.tokens.to_le_bytes());
        h[24..32].copy_from_slice(&self.documents.to_le_bytes());
        h[32..36].copy_from_slice(&self.crc32.to_le_bytes());
        h[36..40].copy_from_slice(&self.eos_id.to_le_bytes());
        let hash = self.tokenizer_hash.as_bytes();
        h[40..40 + hash.len().min(64)].copy_from_slice(&hash[..hash.len().min(64)]);
        h
    }

    fn decode(b: &[u8], path: &Path) -> Result<Header, Error> {
        let bad = |message: String| shard_error(path, message);
        if b.len() < HEADER_BYTES {
            return Err(bad(format!("{} bytes, shorter than the {HEADER_BYTES}-byte header (truncated?)", b.len())));
        }
        if &b[0..8] != MAGIC {
            return Err(bad("not a token shard (bad magic)".into()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(format!("format version {version}; this trainer reads version {VERSION}")));
        }
        let dtype = match u32_at(12) {
            2 => Dtype::U16,
            4 => Dtype::U32,
            other => return Err(bad(format!("{other} bytes per token; expected 2 or 4"))),
        };
        let (tokens, documents) = (u64_at(16), u64_at(24));
        if documents > tokens {
            return Err(bad(format!("the header claims {documents} documents in {tokens} tokens")));
        }
        let hash = &b[40..104];
        let end = hash.iter().position(|&c| c == 0).unwrap_or(hash.len());
        if !hash[..end].iter().all(u8::is_ascii_graphic) {
            return Err(bad("the tokenizer hash is not ASCII text (a corrupt header)".into()));
        }
        Ok(Header {
            dtype,
            tokens,
            documents,
            crc32: u32_at(32),
            eos_id: u32_at(36),
            tokenizer_hash: String::from_utf8_lossy(&hash[..end]).into_owned(),
        })
    }
}

fn shard_error(path: &Path, message: String) -> Error {
    Error::Data { name: path.display().to_string(), message }
}

/// Writes one shard atomically (temporary file, fsync, rename).
pub fn write(path: &Path, tokens: &[u32], dtype: Dtype, eos_id: u32, tokenizer_hash: &str) -> Result<Header, Error> {
    let mut payload = Vec::with_capacity(tokens.len() * dtype.bytes());
    match dtype {
        Dtype::U16 => {
            for &t in tokens {
                let t16 = u16::try_from(t).map_err(|_| shard_error(path, format!("token id {t} does not fit u16")))?;
                payload.extend_from_slice(&t16.to_le_bytes());
            }
        }
        Dtype::U32 => tokens.iter().for_each(|t| payload.extend_from_slice(&t.to_le_bytes())),
    }
    let header = Header {
        dtype,
        tokens: tokens.len() as u64,
        documents: tokens.iter().filter(|&&t| t == eos_id).count() as u64,
        crc32: crc32fast::hash(&payload),
        eos_id,
        tokenizer_hash: tokenizer_hash.to_string(),
    };
    let mut bytes = Vec::with_capacity(HEADER_BYTES + payload.len());
    bytes.write_all(&header.encode()).expect("writing to a Vec");
    bytes.extend_from_slice(&payload);
    crate::files::write_atomic(path, &bytes).map_err(crate::io_err(path))?;
    Ok(header)
}

/// A memory-mapped shard whose header, length and checksum were verified on open.
pub struct Shard {
    path: PathBuf,
    header: Header,
    map: memmap2::Mmap,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard").field("path", &self.path).field("header", &self.header).finish()
    }
}

impl Shard {
    /// Opens and verifies a shard; every error names the file.
    pub fn open(path: &Path) -> Result<Shard, Error> {
        let file = std::fs::File::open(path).map_err(crate::io_err(path))?;
        // SAFETY: shards are written once by rename and never modified in place; a
        // file truncated under us would fault, which the checksum pass below makes unlikely.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(crate::io_err(path))?;
        let header = Header::decode(&map, path)?;
        let want =
            header.tokens.checked_mul(header.dtype.bytes() as u64).and_then(|b| b.checked_add(HEADER_BYTES as u64));
        if want != Some(map.len() as u64) {
            return Err(shard_error(
                path,
                format!(
                    "truncated or padded: the header says {} tokens ({} bytes with the header), the file has {} bytes",
                    header.tokens,
                    want.map_or("too many".into(), |w| w.to_string()),
                    map.len()
                ),
            ));
        }
        let crc = crc32fast::hash(&map[HEADER_BYTES..]);
        if crc != header.crc32 {
            return Err(shard_error(
                path,
                format!("checksum mismatch: CRC-32 {crc:08x}, header says {:08x} (corrupt)", header.crc32),
            ));
        }
        Ok(Shard { path: path.to_path_buf(), header, map })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> u64 {
        self.header.tokens
    }

    pub fn is_empty(&self) -> bool {
        self.header.tokens == 0
    }

    /// Tokens `start..start + len`, borrowed when stored as u32.
    pub fn tokens(&self, start: u64, len: usize) -> Cow<'_, [u32]> {
        let payload = &self.map[HEADER_BYTES..];
        let (s, e) = (start as usize, start as usize + len);
        assert!(e as u64 <= self.header.tokens, "{}: tokens {s}..{e} of {}", self.path.display(), self.header.tokens);
        match self.header.dtype {
            Dtype::U16 => Cow::Owned(
                payload[2 * s..2 * e].chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32).collect(),
            ),
            Dtype::U32 => {
                let bytes = &payload[4 * s..4 * e];
                // The mapping is page-aligned and the header is 128 bytes, so u32s are aligned.
                let (pre, words, post) = unsafe { bytes.align_to::<u32>() };
                if pre.is_empty() && post.is_empty() && cfg!(target_endian = "little") {
                    Cow::Borrowed(words)
                } else {
                    Cow::Owned(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
                }
            }
        }
    }
}

/// One shard's entry in a manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// File name, relative to the manifest.
    pub file: String,
    pub tokens: u64,
    pub documents: u64,
    pub crc32: u32,
}

/// The tokenizer a source was prepared with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestTokenizer {
    pub hash: String,
    pub vocab_size: usize,
    pub eos_id: u32,
    /// The tokenizer.json beside the manifest, if it was copied there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// A prepared source: its shards, split into train and validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub name: String,
    pub tokenizer: ManifestTokenizer,
    pub dtype: Dtype,
    pub train: Vec<ShardEntry>,
    pub validation: Vec<ShardEntry>,
    /// Structured multiple-choice records (MedQA jsonl, split like the shards), for GRPO
    /// and `trainer eval --task mcq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<RecordFiles>,
    /// How it was made: inputs, format, field, validation fraction, seed.
    #[serde(default)]
    pub input: serde_json::Value,
}

/// The record files of a multiple-choice source, relative to the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordFiles {
    pub train: String,
    pub validation: String,
}

pub const MANIFEST_FORMAT: &str = "puretransformer-shards";

impl Manifest {
    /// Reads `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest, Error> {
        let path = dir.join(MANIFEST);
        let text = crate::files::read_text_capped(&path, crate::files::limits::MANIFEST_BYTES).map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::NotFound {
                "; is this a `trainer prepare` output directory?"
            } else {
                ""
            };
            shard_error(&path, format!("{e}{hint}"))
        })?;
        Self::parse(&text, &path)
    }

    /// A manifest's text; errors name `origin`.
    pub fn parse(text: &str, origin: &Path) -> Result<Manifest, Error> {
        let path = origin;
        let m: Manifest =
            serde_json::from_str(text).map_err(|e| shard_error(path, format!("not a shard manifest: {e}")))?;
        if m.format != MANIFEST_FORMAT || m.version != VERSION {
            return Err(shard_error(
                path,
                format!("format {:?} version {}; expected {MANIFEST_FORMAT:?} version {VERSION}", m.format, m.version),
            ));
        }
        m.check(path)?;
        Ok(m)
    }

    /// What a manifest must hold before any of its names become paths or its counts
    /// become sizes: plain file names, each shard named once, and token counts whose
    /// bytes fit in a file.
    fn check(&self, path: &Path) -> Result<(), Error> {
        let bad = |field: String, message: String| shard_error(path, format!("{field}: {message}"));
        let mut names = std::collections::HashSet::new();
        let shards = [("train", &self.train), ("validation", &self.validation)];
        for (split, entries) in shards {
            for (i, e) in entries.iter().enumerate() {
                let field = format!("{split}[{i}].file");
                crate::files::plain_name(&e.file).map_err(|m| bad(field.clone(), m))?;
                if e.file == MANIFEST || !names.insert(e.file.as_str()) {
                    return Err(bad(field, format!("{:?} is named twice (or is the manifest itself)", e.file)));
                }
                if e.tokens
                    .checked_mul(self.dtype.bytes() as u64)
                    .and_then(|b| b.checked_add(HEADER_BYTES as u64))
                    .is_none()
                {
                    return Err(bad(
                        format!("{split}[{i}].tokens"),
                        format!("{} tokens cannot fit in a file", e.tokens),
                    ));
                }
                if e.documents > e.tokens {
                    return Err(bad(
                        format!("{split}[{i}].documents"),
                        format!("{} documents in {} tokens (each ends with a token)", e.documents, e.tokens),
                    ));
                }
            }
            if entries.iter().try_fold(0u64, |sum, e| sum.checked_add(e.tokens)).is_none() {
                return Err(bad(split.into(), "the token counts overflow 64 bits".into()));
            }
        }
        if let Some(file) = &self.tokenizer.file {
            crate::files::plain_name(file).map_err(|m| bad("tokenizer.file".into(), m))?;
        }
        if let Some(records) = &self.records {
            crate::files::plain_name(&records.train).map_err(|m| bad("records.train".into(), m))?;
            crate::files::plain_name(&records.validation).map_err(|m| bad("records.validation".into(), m))?;
        }
        Ok(())
    }

    pub fn write(&self, dir: &Path) -> Result<(), Error> {
        let path = dir.join(MANIFEST);
        let json = serde_json::to_string_pretty(self).expect("Manifest serializes");
        crate::files::write_atomic(&path, json.as_bytes()).map_err(crate::io_err(&path))
    }

    pub fn tokens(entries: &[ShardEntry]) -> u64 {
        entries.iter().map(|e| e.tokens).sum()
    }
}

/// The shards of one split of a prepared source, opened and checked against the manifest.
#[derive(Debug)]
pub struct ShardSet {
    pub shards: Vec<Shard>,
}

impl ShardSet {
    pub fn open(dir: &Path, entries: &[ShardEntry], manifest: &Manifest) -> Result<ShardSet, Error> {
        let mut shards = Vec::with_capacity(entries.len());
        for e in entries {
            let path = dir.join(&e.file);
            let shard = Shard::open(&path)?;
            let h = shard.header();
            if h.tokens != e.tokens || h.crc32 != e.crc32 {
                return Err(shard_error(
                    &path,
                    format!(
                        "does not match {}: {} tokens / CRC {:08x} here, {} / {:08x} in the manifest",
                        MANIFEST, h.tokens, h.crc32, e.tokens, e.crc32
                    ),
                ));
            }
            if h.tokenizer_hash != manifest.tokenizer.hash {
                return Err(shard_error(
                    &path,
                    format!("made with tokenizer {}, the manifest says {}", h.tokenizer_hash, manifest.tokenizer.hash),
                ));
            }
            shards.push(shard);
        }
        Ok(ShardSet { shards })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_util::TempDir;

    fn tokens(n: u32) -> Vec<u32> {
        (0..n).map(|i| if i % 7 == 6 { 0 } else { 1 + i % 50_000 }).collect()
    }

    #[test]
    fn round_trip_in_both_widths() {
        let dir = TempDir::new("shard-rt");
        for (dtype, max) in [(Dtype::U16, 60_000), (Dtype::U32, 100_000)] {
            let toks: Vec<u32> = tokens(10_000).into_iter().map(|t| t.min(max)).collect();
            let path = dir.0.join(format!("{dtype:?}.bin"));
            let h = write(&path, &toks, dtype, 0, "abc123").unwrap();
            assert_eq!((h.tokens, h.documents), (10_000, 10_000 / 7));
            let s = Shard::open(&path).unwrap();
            assert_eq!(s.header(), &h);
            assert_eq!(s.tokens(0, 10_000).as_ref(), toks.as_slice());
            assert_eq!(s.tokens(1234, 5).as_ref(), &toks[1234..1239]);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), (HEADER_BYTES + 10_000 * dtype.bytes()) as u64);
        }
        assert!(
            write(&dir.0.join("x.bin"), &[70_000], Dtype::U16, 0, "h")
                .unwrap_err()
                .to_string()
                .contains("does not fit u16")
        );
    }

    #[test]
    fn corrupt_truncated_and_foreign_files_are_rejected_by_name() {
        let dir = TempDir::new("shard-bad");
        let path = dir.0.join("train-00000.bin");
        write(&path, &tokens(1000), Dtype::U16, 0, "h").unwrap();
        let good = std::fs::read(&path).unwrap();

        let mut flipped = good.clone();
        flipped[HEADER_BYTES + 10] ^= 0x40;
        std::fs::write(&path, &flipped).unwrap();
        let e = Shard::open(&path).unwrap_err().to_string();
        assert!(e.contains("train-00000.bin") && e.contains("checksum mismatch"), "{e}");

        std::fs::write(&path, &good[..good.len() - 6]).unwrap();
        let e = Shard::open(&path).unwrap_err().to_string();
        assert!(e.contains("train-00000.bin") && e.contains("truncated"), "{e}");

        std::fs::write(&path, &good[..40]).unwrap();
        assert!(Shard::open(&path).unwrap_err().to_string().contains("shorter than the 128-byte header"));

        std::fs::write(&path, b"{\"text\": \"not a shard, but long enough to hold a header ......................................................................\"}").unwrap();
        assert!(Shard::open(&path).unwrap_err().to_string().contains("bad magic"));

        let mut future = good.clone();
        future[8] = 9;
        std::fs::write(&path, &future).unwrap();
        assert!(Shard::open(&path).unwrap_err().to_string().contains("format version 9"));

        // Sizes that lie: more tokens than the file holds (even 2^63, whose byte count
        // overflows), more documents than tokens. Refused from the header alone.
        for (tokens, documents, problem) in [
            (1u64 << 40, 0u64, "the header says 1099511627776 tokens"),
            (1 << 63, 0, "(too many bytes with the header)"),
            (1000, 1001, "claims 1001 documents in 1000 tokens"),
        ] {
            let mut lying = good.clone();
            lying[16..24].copy_from_slice(&tokens.to_le_bytes());
            lying[24..32].copy_from_slice(&documents.to_le_bytes());
            std::fs::write(&path, &lying).unwrap();
            let e = Shard::open(&path).unwrap_err().to_string();
            assert!(e.contains("train-00000.bin") && e.contains(problem), "{e}");
        }
    }

    fn manifest_with(train: serde_json::Value) -> String {
        serde_json::json!({
            "format": MANIFEST_FORMAT, "version": VERSION, "name": "web",
            "tokenizer": {"hash": "h", "vocabSize": 512, "eosId": 0},
            "dtype": "u16", "train": train, "validation": [],
        })
        .to_string()
    }

    #[test]
    fn manifests_name_only_plain_files_and_sizes_that_fit() {
        let entry = |file: &str, tokens: u64, documents: u64| serde_json::json!({"file": file, "tokens": tokens, "documents": documents, "crc32": 0});
        let origin = Path::new("/data/web/manifest.json");
        let good = manifest_with(serde_json::json!([entry("train-00000.bin", 10, 1)]));
        assert_eq!(Manifest::parse(&good, origin).unwrap().train[0].file, "train-00000.bin");
        let cases = [
            (vec![entry("../../etc/passwd", 10, 1)], "train[0].file: \"../../etc/passwd\" is not a plain file name"),
            (vec![entry("/abs/path", 10, 1)], "train[0].file: \"/abs/path\" is not a plain file name"),
            (vec![entry("a\0b", 10, 1)], "train[0].file: \"a\\0b\" is not a plain file name"),
            (vec![entry("x.bin", 1, 0), entry("x.bin", 1, 0)], "train[1].file: \"x.bin\" is named twice"),
            (vec![entry("manifest.json", 1, 0)], "train[0].file: \"manifest.json\" is named twice"),
            (vec![entry("x.bin", 1 << 63, 0)], "train[0].tokens: 9223372036854775808 tokens cannot fit"),
            (vec![entry("x.bin", 3, 4)], "train[0].documents: 4 documents in 3 tokens"),
            (
                vec![
                    entry("a.bin", 1 << 62, 0),
                    entry("b.bin", 1 << 62, 0),
                    entry("c.bin", 1 << 62, 0),
                    entry("d.bin", 1 << 62, 0),
                ],
                "train: the token counts overflow 64 bits",
            ),
        ];
        for (train, problem) in cases {
            let e = Manifest::parse(&manifest_with(serde_json::Value::Array(train)), origin).unwrap_err().to_string();
            assert!(e.contains("/data/web/manifest.json") && e.contains(problem), "{problem}: {e}");
        }
        let mut records: serde_json::Value = serde_json::from_str(&good).unwrap();
        records["records"] = serde_json::json!({"train": "train.jsonl", "validation": "../v.jsonl"});
        let e = Manifest::parse(&records.to_string(), origin).unwrap_err().to_string();
        assert!(e.contains("records.validation: \"../v.jsonl\""), "{e}");
        records["records"]["validation"] = "v.jsonl".into();
        records["tokenizer"]["file"] = "/etc/tokenizer.json".into();
        let e = Manifest::parse(&records.to_string(), origin).unwrap_err().to_string();
        assert!(e.contains("tokenizer.file: \"/etc/tokenizer.json\""), "{e}");
    }

    #[test]
    fn a_huge_manifest_is_refused_before_it_is_read() {
        let dir = TempDir::new("manifest-bomb");
        std::fs::File::create(dir.0.join(MANIFEST)).unwrap().set_len(1 << 40).unwrap();
        let e = Manifest::read(&dir.0).unwrap_err().to_string();
        assert!(e.contains("manifest.json") && e.contains("1099511627776 bytes, more than the 67108864"), "{e}");
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        fn cases() -> u32 {
            std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256)
        }

        fn names() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z0-9-]{1,12}\\.bin",
                "\\PC{0,16}",
                proptest::sample::select(vec!["..", ".", "", "/abs", "../x.bin", "a/b.bin", "x\0y"])
                    .prop_map(String::from),
            ]
        }

        fn entries() -> impl Strategy<Value = Vec<serde_json::Value>> {
            let count = prop_oneof![0u64..5_000_000, any::<u64>()];
            proptest::collection::vec((names(), count.clone(), count), 0..4).prop_map(|entries| {
                entries
                    .into_iter()
                    .map(|(file, tokens, documents)| {
                        serde_json::json!({"file": file, "tokens": tokens, "documents": documents, "crc32": 7})
                    })
                    .collect()
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

            /// Whatever a manifest lists, it parses to names that are plain files and
            /// counts whose bytes fit, or it is refused naming the manifest; what parses
            /// writes back to the same manifest.
            #[test]
            fn any_manifest_is_safe_or_refused_by_name(train in entries(), validation in entries(), dtype in prop_oneof![Just("u16"), Just("u32")]) {
                let text = serde_json::json!({
                    "format": MANIFEST_FORMAT, "version": VERSION, "name": "web",
                    "tokenizer": {"hash": "h", "vocabSize": 512, "eosId": 0},
                    "dtype": dtype, "train": train, "validation": validation,
                })
                .to_string();
                let origin = Path::new("/data/web/manifest.json");
                match Manifest::parse(&text, origin) {
                    Ok(m) => {
                        for e in m.train.iter().chain(&m.validation) {
                            prop_assert_eq!(crate::files::plain_name(&e.file), Ok(e.file.as_str()));
                            prop_assert!(e.tokens.checked_mul(m.dtype.bytes() as u64).is_some());
                        }
                        let _ = Manifest::tokens(&m.train);
                        let again = serde_json::to_string(&m).unwrap();
                        prop_assert_eq!(Manifest::parse(&again, origin).unwrap(), m);
                    }
                    Err(e) => prop_assert!(e.to_string().contains("/data/web/manifest.json"), "{e}"),
                }
            }

            /// Any header bytes: decoded or refused naming the shard; what a shard's
            /// header says, it decodes back to.
            #[test]
            fn any_shard_header_is_decoded_or_refused_by_name(mut bytes in proptest::collection::vec(any::<u8>(), 0..160), magic in any::<bool>(), dtype in 0u32..6) {
                if magic && bytes.len() >= HEADER_BYTES {
                    bytes[0..8].copy_from_slice(MAGIC);
                    bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
                    bytes[12..16].copy_from_slice(&dtype.to_le_bytes());
                }
                let path = Path::new("/data/web/train-00000.bin");
                match Header::decode(&bytes, path) {
                    Ok(h) => {
                        prop_assert!(h.documents <= h.tokens);
                        let mut encoded = h.encode();
                        prop_assert_eq!(Header::decode(&encoded, path).unwrap(), h.clone());
                        encoded[104..].fill(0);
                        prop_assert_eq!(Header::decode(&encoded, path).unwrap(), h);
                    }
                    Err(e) => prop_assert!(e.to_string().contains("train-00000.bin"), "{e}"),
                }
            }
        }
    }
}
