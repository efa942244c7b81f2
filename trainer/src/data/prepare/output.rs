//! Where a preparation's files go: a directory, or an `s3://bucket/prefix` whose files are
//! staged in a local directory and uploaded a part at a time. Either way a part's manifest
//! is published after its shards and the dataset's manifest after everything, so a name
//! that can be read names complete files.

use std::path::{Path, PathBuf};

use crate::storage::{self, S3};
use crate::{Error, io_err};

/// The output of a preparation.
pub enum Output {
    Dir(PathBuf),
    S3 { store: S3, bucket: String, prefix: String, staging: PathBuf },
}

/// The largest part or dataset manifest read back.
const MANIFEST_LIMIT: u64 = 64 << 20;

impl Output {
    /// `s3://bucket/prefix` (credentials from the standard AWS chain), or a directory.
    pub fn parse(uri: &str) -> Result<Output, Error> {
        if !uri.starts_with("s3://") {
            let dir = PathBuf::from(uri);
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            return Ok(Output::Dir(dir));
        }
        let (bucket, prefix) = storage::parse_uri(uri)
            .ok_or_else(|| Error::InvalidSpec(format!("--output {uri}: write s3://bucket/prefix")))?;
        let staging = crate::data::cache_dir().join("prepare-staging").join(format!(
            "{bucket}_{}-{}",
            prefix.replace('/', "_"),
            std::process::id()
        ));
        std::fs::create_dir_all(&staging).map_err(io_err(&staging))?;
        Ok(Output::S3 { store: S3::from_env()?, bucket, prefix, staging })
    }

    /// Where shards are written before they are published.
    pub fn work_dir(&self) -> &Path {
        match self {
            Output::Dir(dir) => dir,
            Output::S3 { staging, .. } => staging,
        }
    }

    /// The file `name`'s bytes, or `None` when it has not been published.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, Error> {
        match self {
            Output::Dir(dir) => {
                let path = dir.join(name);
                match crate::files::read_capped(&path, MANIFEST_LIMIT) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(io_err(&path)(e)),
                }
            }
            Output::S3 { store, bucket, prefix, .. } => {
                let key = storage::join(prefix, name);
                match store.size(bucket, &key)? {
                    Some(_) => Ok(Some(store.get_bytes(bucket, &key, MANIFEST_LIMIT)?)),
                    None => Ok(None),
                }
            }
        }
    }

    /// Publishes `files` (names in [`Self::work_dir`]), then `name` holding `bytes`.
    pub fn publish(&self, files: &[String], name: &str, bytes: &[u8]) -> Result<(), Error> {
        match self {
            Output::Dir(dir) => {
                let path = dir.join(name);
                crate::files::write_atomic(&path, bytes).map_err(io_err(&path))
            }
            Output::S3 { store, bucket, prefix, staging } => {
                for f in files {
                    let path = staging.join(f);
                    store.put_file(bucket, &storage::join(prefix, f), &path)?;
                }
                store.put_bytes(bucket, &storage::join(prefix, name), bytes.to_vec())?;
                for f in files {
                    let _ = std::fs::remove_file(staging.join(f));
                }
                Ok(())
            }
        }
    }

    /// Removes staged files that will not be published (a failed part's shards).
    pub fn discard(&self, files: &[String]) {
        for f in files {
            let _ = std::fs::remove_file(self.work_dir().join(f));
        }
    }

    /// The output as the user named it.
    pub fn uri(&self) -> String {
        match self {
            Output::Dir(dir) => dir.display().to_string(),
            Output::S3 { bucket, prefix, .. } => storage::uri(bucket, prefix),
        }
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if let Output::S3 { staging, .. } = self {
            let _ = std::fs::remove_dir_all(staging);
        }
    }
}
