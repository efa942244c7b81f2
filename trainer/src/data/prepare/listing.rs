//! The inputs of a preparation, listed once as units of work: local files and
//! directories, `s3://bucket/prefix` objects, each optionally ending in a glob of names
//! (`raw/*.parquet`, `s3://raw/usmle/**/*.jsonl`), and `https://` URLs of single files,
//! in one order: the inputs' order, each input's files sorted.

use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};
use sha2::{Digest, Sha256};

use super::inputs::InputFormat;
use crate::https::{self, Https};
use crate::storage::{self, S3};
use crate::{Error, io_err};

/// Where a unit's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    S3 { bucket: String, key: String },
    Https(String),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::S3 { bucket, key } => f.write_str(&storage::uri(bucket, key)),
            Location::Https(url) => f.write_str(url),
        }
    }
}

/// One input file: the unit of work, of resumption and of failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Its position in the listing; names its part (`part-NNNNN.json`) and its shards.
    pub index: usize,
    pub location: Location,
    /// Its path below the input it was found under (its file name when it was given
    /// itself), `#n` appended to the n-th repeat of a key. It seeds the split of its
    /// documents, so the split depends on neither the worker count nor where the inputs
    /// are mounted.
    pub key: String,
    /// The format asked for (`Auto` is decided when the file is read).
    pub format: InputFormat,
    pub bytes: u64,
}

impl Unit {
    /// The seed of this unit's validation split under the preparation's `seed`.
    pub fn split_seed(&self, seed: u64) -> u64 {
        let digest = Sha256::digest(self.key.as_bytes());
        let key = u64::from_le_bytes(digest[..8].try_into().expect("a SHA-256 has 8 bytes"));
        crate::rng::splitmix64(seed ^ key)
    }

    /// The unit as a local file: itself, or its object or URL downloaded into `scratch`
    /// (removed when the returned file is dropped).
    pub fn fetch(&self, clients: &Clients, scratch: &Path) -> Result<LocalFile, Error> {
        let temporary = |name: &str| scratch.join(format!(".input-{:05}-{name}", self.index));
        match &self.location {
            Location::Local(p) => Ok(LocalFile { path: p.clone(), temporary: false }),
            Location::S3 { bucket, key } => {
                let s3 = clients.s3.as_ref().expect("an S3 unit is listed with a client");
                let name = Path::new(key).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let file = LocalFile { path: temporary(&name), temporary: true };
                s3.get_file(bucket, key, &file.path, u64::MAX)?;
                Ok(file)
            }
            Location::Https(url) => {
                let client = clients.https.as_ref().expect("an https unit is listed with a client");
                let file = LocalFile { path: temporary(&https::file_name(url)), temporary: true };
                client.get_file(url, &file.path)?;
                Ok(file)
            }
        }
    }
}

/// A unit's bytes on the local disk.
pub struct LocalFile {
    pub path: PathBuf,
    temporary: bool,
}

impl Drop for LocalFile {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The clients that remote units need, made when the listing has such a unit.
#[derive(Debug, Default)]
pub struct Clients {
    pub s3: Option<S3>,
    pub https: Option<Https>,
}

/// The listing: the units in order, and the clients their remote files need.
pub struct Listing {
    pub units: Vec<Unit>,
    pub clients: Clients,
}

/// An input split at its first component with a glob character: the part to walk or
/// list, and the glob over the names below it.
fn split_glob(input: &str) -> (&str, Option<&str>) {
    let glob_at = input.split('/').scan(0usize, |at, c| {
        let start = *at;
        *at += c.len() + 1;
        Some((start, c))
    });
    for (start, component) in glob_at {
        if component.contains(['*', '?', '[', '{']) {
            return (input[..start].trim_end_matches('/'), Some(&input[start..]));
        }
    }
    (input, None)
}

fn matcher(input: &str, glob: &str) -> Result<GlobMatcher, Error> {
    GlobBuilder::new(glob)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| Error::InvalidSpec(format!("--input {input}: {e}")))
}

/// Lists `inputs` in order, each input's files sorted by key.
pub fn list(inputs: &[String], format: InputFormat) -> Result<Listing, Error> {
    let mut found: Vec<(Location, String, u64)> = Vec::new();
    let mut clients = Clients::default();
    for input in inputs {
        if input.starts_with("http://") {
            return Err(Error::InvalidSpec(format!("--input {input}: plain http is refused; give an https:// URL")));
        }
        if https::is_url(input) {
            if clients.https.is_none() {
                clients.https = Some(Https::new()?);
            }
            let client = clients.https.as_ref().expect("set above");
            // Sizes only balance the workers: a server that gives none weighs its files 0.
            let bytes = client.size(input)?.unwrap_or(0);
            found.push((Location::Https(input.clone()), https::file_name(input), bytes));
            continue;
        }
        let before = found.len();
        let (base, glob) = split_glob(input);
        let glob = glob.map(|g| matcher(input, g)).transpose()?;
        if let Some((bucket, prefix)) = storage::parse_uri(base) {
            if clients.s3.is_none() {
                clients.s3 = Some(S3::from_env()?);
            }
            let client = clients.s3.as_ref().expect("set above");
            list_s3(client, &bucket, &prefix, glob.as_ref(), &mut found)?;
        } else {
            list_local(Path::new(if base.is_empty() { "." } else { base }), glob.as_ref(), &mut found)?;
        }
        if found.len() == before {
            let what = if glob.is_some() {
                "no file matches"
            } else {
                "no such file, and no file in a directory or prefix of that name"
            };
            return Err(Error::Data { name: input.clone(), message: format!("--input: {what}") });
        }
    }
    let keys = unique_keys(found.iter().map(|(_, k, _)| k.clone()).collect());
    let units = found
        .into_iter()
        .zip(keys)
        .enumerate()
        .map(|(index, ((location, _, bytes), key))| Unit { index, location, key, format, bytes })
        .collect();
    Ok(Listing { units, clients })
}

fn list_local(base: &Path, glob: Option<&GlobMatcher>, out: &mut Vec<(Location, String, u64)>) -> Result<(), Error> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io_err(dir))?
            .map(|e| e.map(|e| e.path()).map_err(io_err(dir)))
            .collect::<Result<_, _>>()?;
        entries.sort();
        for p in entries {
            if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')) {
                continue;
            }
            if p.is_dir() { walk(&p, out)? } else { out.push(p) }
        }
        Ok(())
    }
    let files = if base.is_dir() {
        let mut files = Vec::new();
        walk(base, &mut files)?;
        files
    } else if base.is_file() && glob.is_none() {
        vec![base.to_path_buf()]
    } else {
        return Ok(());
    };
    for f in files {
        let below = if base.is_dir() {
            f.strip_prefix(base).unwrap_or(&f)
        } else {
            Path::new(f.file_name().unwrap_or(f.as_os_str()))
        };
        let key = below.to_string_lossy().into_owned();
        if glob.is_some_and(|g| !g.is_match(&key)) {
            continue;
        }
        let bytes = std::fs::metadata(&f).map_err(io_err(&f))?.len();
        out.push((Location::Local(f), key, bytes));
    }
    Ok(())
}

fn list_s3(
    s3: &S3,
    bucket: &str,
    prefix: &str,
    glob: Option<&GlobMatcher>,
    out: &mut Vec<(Location, String, u64)>,
) -> Result<(), Error> {
    // The prefix names one object, or a "directory" of them.
    if glob.is_none()
        && !prefix.is_empty()
        && let Some(bytes) = s3.size(bucket, prefix)?
    {
        let name = prefix.rsplit('/').next().unwrap_or(prefix).to_string();
        out.push((Location::S3 { bucket: bucket.into(), key: prefix.into() }, name, bytes));
        return Ok(());
    }
    let dir = if prefix.is_empty() { String::new() } else { format!("{prefix}/") };
    let mut objects = s3.list(bucket, &dir)?;
    objects.sort();
    for (key, bytes) in objects {
        let below = key[dir.len()..].to_string();
        let hidden = below.split('/').any(|c| c.starts_with('.'));
        if below.is_empty() || below.ends_with('/') || hidden || glob.is_some_and(|g| !g.is_match(&below)) {
            continue;
        }
        out.push((Location::S3 { bucket: bucket.into(), key }, below, bytes));
    }
    Ok(())
}

/// Makes keys unique in listing order: the second `a.jsonl` becomes `a.jsonl#1`.
fn unique_keys(keys: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashMap::<String, usize>::new();
    keys.into_iter()
        .map(|k| {
            let n = seen.entry(k.clone()).or_insert(0);
            let key = if *n == 0 { k } else { format!("{k}#{n}") };
            *n += 1;
            key
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_util::TempDir;

    #[test]
    fn globs_split_at_their_first_component() {
        for (input, want) in [
            ("data/raw", ("data/raw", None)),
            ("data/raw/*.parquet", ("data/raw", Some("*.parquet"))),
            ("s3://raw/fineweb/**/*.parquet", ("s3://raw/fineweb", Some("**/*.parquet"))),
            ("s3://raw/cc-2024-*/part-?.jsonl", ("s3://raw", Some("cc-2024-*/part-?.jsonl"))),
            ("*.txt", ("", Some("*.txt"))),
        ] {
            assert_eq!(split_glob(input), want, "{input}");
        }
    }

    #[test]
    fn local_inputs_list_in_order_with_keys_below_their_input() {
        let dir = TempDir::new("listing");
        let raw = dir.0.join("raw");
        std::fs::create_dir_all(raw.join("b/c")).unwrap();
        for f in ["a.parquet", "b/x.parquet", "b/c/y.parquet", "b/notes.txt", ".hidden.parquet"] {
            std::fs::write(raw.join(f), f).unwrap();
        }
        let keys = |inputs: &[String]| -> Vec<String> {
            list(inputs, InputFormat::Auto).unwrap().units.into_iter().map(|u| u.key).collect()
        };
        let s = |p: &Path| p.display().to_string();
        assert_eq!(keys(&[s(&raw)]), ["a.parquet", "b/c/y.parquet", "b/notes.txt", "b/x.parquet"]);
        assert_eq!(keys(&[format!("{}/*.parquet", s(&raw))]), ["a.parquet"]);
        assert_eq!(keys(&[format!("{}/**/*.parquet", s(&raw))]), ["a.parquet", "b/c/y.parquet", "b/x.parquet"]);
        assert_eq!(keys(&[format!("{}/b/*/*.parquet", s(&raw))]), ["c/y.parquet"]);
        assert_eq!(keys(&[s(&raw.join("b/notes.txt")), s(&raw.join("a.parquet"))]), ["notes.txt", "a.parquet"]);
        assert_eq!(keys(&[s(&raw.join("a.parquet")), s(&raw.join("a.parquet"))]), ["a.parquet", "a.parquet#1"]);
        let units = list(&[s(&raw)], InputFormat::Jsonl).unwrap().units;
        assert_eq!(units.iter().map(|u| u.index).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(units[0].bytes, "a.parquet".len() as u64);
        assert!(units.iter().all(|u| u.format == InputFormat::Jsonl));
        let e = list(&[format!("{}/*.jsonl", s(&raw))], InputFormat::Auto).err().unwrap().to_string();
        assert!(e.contains("*.jsonl") && e.contains("no file matches"), "{e}");
        let e = list(&[s(&raw.join("missing"))], InputFormat::Auto).err().unwrap().to_string();
        assert!(e.contains("missing") && e.contains("no such file"), "{e}");
        std::fs::create_dir_all(raw.join("empty")).unwrap();
        let e = list(&[s(&raw.join("empty"))], InputFormat::Auto).err().unwrap().to_string();
        assert!(e.contains("empty") && e.contains("no file in a directory"), "{e}");
        let e = list(&[format!("{}/[a.parquet", s(&raw))], InputFormat::Auto).err().unwrap().to_string();
        assert!(e.contains("[a.parquet"), "{e}");
    }

    #[test]
    fn repeated_keys_are_numbered_and_seeds_follow_keys() {
        let keys = unique_keys(vec!["a.jsonl".into(), "b.jsonl".into(), "a.jsonl".into(), "a.jsonl".into()]);
        assert_eq!(keys, ["a.jsonl", "b.jsonl", "a.jsonl#1", "a.jsonl#2"]);
        let unit = |key: &str, path: &str| Unit {
            index: 0,
            location: Location::Local(path.into()),
            key: key.into(),
            format: InputFormat::Jsonl,
            bytes: 1,
        };
        let a = unit("part-1.jsonl", "/mnt/x/part-1.jsonl");
        assert_eq!(a.split_seed(0), unit("part-1.jsonl", "/data/part-1.jsonl").split_seed(0), "the mount path");
        assert_ne!(a.split_seed(0), unit("part-2.jsonl", "/mnt/x/part-1.jsonl").split_seed(0));
        assert_ne!(a.split_seed(0), a.split_seed(1));
    }
}
