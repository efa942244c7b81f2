//! S3 through aws-sdk-s3, behind a small blocking API for the trainer's threads.
//!
//! Credentials and region come from the standard AWS chain (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, profiles, web identity),
//! which the operator fills from the run's `secretRef`; they are never logged. A custom
//! endpoint (`AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`) switches to path-style
//! addressing, as S3-compatible stores expect. Transient failures are retried with
//! exponential backoff by the SDK (5 attempts); what remains is an [`Error::Storage`]
//! naming the bucket, the key and the cause.

use std::path::Path;
use std::sync::{Arc, Mutex};

use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{Region, RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_smithy_http_client::tls;
use crds::config::{ResolvedS3, RunConfig};

use crate::{Error, io_err};

/// Objects at least this large are uploaded in parts of this size (S3 wants ≥ 5 MiB).
pub const PART_BYTES: usize = 64 << 20;

/// `s3://bucket/key`.
pub fn uri(bucket: &str, key: &str) -> String {
    format!("s3://{bucket}/{key}")
}

/// Splits `s3://bucket/prefix` into (bucket, prefix without slashes at the ends).
pub fn parse_uri(s: &str) -> Option<(String, String)> {
    let rest = s.strip_prefix("s3://")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    (!bucket.is_empty()).then(|| (bucket.to_string(), prefix.trim_matches('/').to_string()))
}

/// `prefix/name`, or `name` at the bucket's root.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") }
}

/// Overrides of the standard AWS configuration chain.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    pub endpoint: Option<String>,
    /// Access key id and secret.
    pub credentials: Option<(String, String)>,
    pub region: Option<String>,
}

impl std::fmt::Debug for S3Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl S3Options {
    /// The options for a run's data (its tokenizer, the mix's sources, GRPO's question
    /// sets): the standard chain, with the checkpoint mirror's endpoint and region as
    /// defaults, since data and checkpoints usually share a store; the AWS variables win.
    pub fn for_data(cfg: &RunConfig) -> S3Options {
        let env_endpoint = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"].iter().any(|v| std::env::var_os(v).is_some());
        let mirror = cfg.checkpoint.s3.as_ref();
        S3Options {
            endpoint: if env_endpoint { None } else { mirror.and_then(|m| m.endpoint.clone()) },
            credentials: None,
            region: if std::env::var_os("AWS_REGION").is_some() { None } else { mirror.and_then(|m| m.region.clone()) },
        }
    }

    /// The options for the checkpoint mirror (`spec.checkpoint.s3`).
    pub fn for_mirror(s3: &ResolvedS3) -> S3Options {
        S3Options { endpoint: s3.endpoint.clone(), credentials: None, region: s3.region.clone() }
    }
}

/// The process's client for `options`, built on first use and shared by every reader
/// and writer after it (each client holds a runtime and a connection pool).
pub fn client(options: &S3Options) -> Result<Arc<S3>, Error> {
    static CLIENTS: Mutex<Vec<(S3Options, Arc<S3>)>> = Mutex::new(Vec::new());
    let mut clients = CLIENTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, s3)) = clients.iter().find(|(o, _)| o == options) {
        return Ok(Arc::clone(s3));
    }
    let s3 = Arc::new(S3::with(options)?);
    clients.push((options.clone(), Arc::clone(&s3)));
    Ok(s3)
}

/// The shared client for a run's data ([`S3Options::for_data`]).
pub fn for_data(cfg: &RunConfig) -> Result<Arc<S3>, Error> {
    client(&S3Options::for_data(cfg))
}

/// A blocking S3 client with its own small runtime.
pub struct S3 {
    client: Client,
    rt: tokio::runtime::Runtime,
}

impl std::fmt::Debug for S3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3").finish_non_exhaustive()
    }
}

fn storage_error<E: ProvideErrorMetadata + std::error::Error + 'static, R: std::fmt::Debug>(
    bucket: &str,
    key: &str,
    op: &str,
    e: SdkError<E, R>,
) -> Error {
    let code = e.code().map(str::to_string);
    let (message, permanent) = match code.as_deref() {
        Some("NoSuchBucket") => (format!("{op}: the bucket {bucket:?} does not exist"), true),
        Some("NoSuchKey") | Some("NotFound") => (format!("{op}: no such object"), true),
        Some("AccessDenied") | Some("InvalidAccessKeyId") | Some("SignatureDoesNotMatch") | Some("Forbidden") => (
            format!(
                "{op}: access denied ({}): check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the run's secretRef)",
                code.as_deref().unwrap_or("")
            ),
            true,
        ),
        _ => (format!("{op}: {}", DisplayErrorContext(&e)), matches!(e, SdkError::ServiceError(_))),
    };
    Error::Storage { uri: uri(bucket, key), message, permanent }
}

impl S3 {
    /// A client from the standard AWS configuration chain.
    pub fn from_env() -> Result<S3, Error> {
        Self::with(&S3Options::default())
    }

    /// A client from the standard chain, with explicit overrides.
    pub fn with(o: &S3Options) -> Result<S3, Error> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("s3")
            .build()
            .map_err(|e| Error::Io { path: "S3 runtime".into(), source: e })?;
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
            .build_https();
        let shared = rt.block_on(aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http).load());
        let custom_endpoint = o.endpoint.is_some()
            || ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"].iter().any(|v| std::env::var_os(v).is_some());
        let mut config = aws_sdk_s3::config::Builder::from(&shared)
            .retry_config(RetryConfig::standard().with_max_attempts(5))
            // S3-compatible stores reject the SDK's default streaming checksums.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .force_path_style(custom_endpoint);
        if let Some(endpoint) = &o.endpoint {
            config = config.endpoint_url(endpoint);
        }
        if let Some((key, secret)) = &o.credentials {
            config =
                config.credentials_provider(aws_sdk_s3::config::Credentials::new(key, secret, None, None, "explicit"));
        }
        if let Some(region) = &o.region {
            config = config.region(Region::new(region.clone()));
        } else if shared.region().is_none() {
            config = config.region(Region::new("us-east-1"));
        }
        Ok(S3 { client: Client::from_conf(config.build()), rt })
    }

    /// Uploads `bytes` to `bucket/key` in one request.
    pub fn put_bytes(&self, bucket: &str, key: &str, bytes: Vec<u8>) -> Result<(), Error> {
        self.rt
            .block_on(self.client.put_object().bucket(bucket).key(key).body(ByteStream::from(bytes)).send())
            .map_err(|e| storage_error(bucket, key, "upload", e))?;
        Ok(())
    }

    /// Uploads a file, in parts of [`PART_BYTES`] when it is larger.
    pub fn put_file(&self, bucket: &str, key: &str, path: &Path) -> Result<(), Error> {
        let len = std::fs::metadata(path).map_err(io_err(path))?.len() as usize;
        if len < PART_BYTES {
            return self.put_bytes(bucket, key, std::fs::read(path).map_err(io_err(path))?);
        }
        let upload = self
            .rt
            .block_on(self.client.create_multipart_upload().bucket(bucket).key(key).send())
            .map_err(|e| storage_error(bucket, key, "start a multipart upload", e))?;
        let id = upload.upload_id().unwrap_or_default().to_string();
        let result = (|| -> Result<(), Error> {
            use std::io::Read;
            let mut file = std::fs::File::open(path).map_err(io_err(path))?;
            let mut parts = Vec::new();
            let mut buf = vec![0u8; PART_BYTES];
            for number in 1.. {
                let mut filled = 0;
                while filled < PART_BYTES {
                    let n = file.read(&mut buf[filled..]).map_err(io_err(path))?;
                    if n == 0 {
                        break;
                    }
                    filled += n;
                }
                if filled == 0 {
                    break;
                }
                let part = self
                    .rt
                    .block_on(
                        self.client
                            .upload_part()
                            .bucket(bucket)
                            .key(key)
                            .upload_id(&id)
                            .part_number(number)
                            .body(ByteStream::from(buf[..filled].to_vec()))
                            .send(),
                    )
                    .map_err(|e| storage_error(bucket, key, "upload a part", e))?;
                parts.push(
                    CompletedPart::builder().part_number(number).set_e_tag(part.e_tag().map(str::to_string)).build(),
                );
                if filled < PART_BYTES {
                    break;
                }
            }
            let done = CompletedMultipartUpload::builder().set_parts(Some(parts)).build();
            self.rt
                .block_on(
                    self.client
                        .complete_multipart_upload()
                        .bucket(bucket)
                        .key(key)
                        .upload_id(&id)
                        .multipart_upload(done)
                        .send(),
                )
                .map_err(|e| storage_error(bucket, key, "complete a multipart upload", e))?;
            Ok(())
        })();
        if result.is_err() {
            let _ =
                self.rt.block_on(self.client.abort_multipart_upload().bucket(bucket).key(key).upload_id(&id).send());
        }
        result
    }

    /// The whole object, when it has at most `limit` bytes: a larger one is refused
    /// before its body is read.
    pub fn get_bytes(&self, bucket: &str, key: &str, limit: u64) -> Result<Vec<u8>, Error> {
        self.get(bucket, key, None, limit)
    }

    /// Bytes `start..start + len` of the object (a ranged GET); a shorter answer is an error.
    pub fn get_range(&self, bucket: &str, key: &str, start: u64, len: u64) -> Result<Vec<u8>, Error> {
        if len == 0 {
            return Ok(Vec::new());
        }
        self.get(bucket, key, Some((start, len)), len)
    }

    fn get(&self, bucket: &str, key: &str, range: Option<(u64, u64)>, limit: u64) -> Result<Vec<u8>, Error> {
        self.rt.block_on(self.get_async(bucket, key, range, limit))
    }

    async fn get_async(
        &self,
        bucket: &str,
        key: &str,
        range: Option<(u64, u64)>,
        limit: u64,
    ) -> Result<Vec<u8>, Error> {
        {
            let mut req = self.client.get_object().bucket(bucket).key(key);
            if let Some((start, len)) = range {
                req = req.range(format!("bytes={start}-{}", start + len - 1));
            }
            let out = match req.send().await {
                Ok(out) => out,
                Err(e) => {
                    let missing = matches!(e.code(), Some("NoSuchKey" | "NotFound"));
                    // Some stores answer NoSuchKey for a missing bucket too: say which.
                    if missing && self.client.head_bucket().bucket(bucket).send().await.is_err() {
                        return Err(Error::Storage {
                            uri: uri(bucket, key),
                            message: format!(
                                "download: the bucket {bucket:?} does not exist (or these credentials cannot see it)"
                            ),
                            permanent: true,
                        });
                    }
                    return Err(storage_error(bucket, key, "download", e));
                }
            };
            let expected = out.content_length().and_then(|l| u64::try_from(l).ok());
            let too_large = |size: String| Error::Storage {
                uri: uri(bucket, key),
                message: format!("download: {size} bytes, more than the {limit} this object may have"),
                permanent: true,
            };
            if let Some(size) = expected.filter(|&s| s > limit) {
                return Err(too_large(size.to_string()));
            }
            let mut body = out.body;
            let mut bytes = Vec::with_capacity(expected.unwrap_or(0) as usize);
            loop {
                let chunk = body.try_next().await.map_err(|e| Error::Storage {
                    uri: uri(bucket, key),
                    message: format!("download: the transfer broke off: {e}"),
                    permanent: false,
                })?;
                let Some(chunk) = chunk else { break };
                if (bytes.len() + chunk.len()) as u64 > limit {
                    return Err(too_large("over".into()));
                }
                bytes.extend_from_slice(&chunk);
            }
            let want = range.map(|(_, len)| len).or(expected);
            if let Some(want) = want.filter(|&w| w != bytes.len() as u64) {
                return Err(Error::Storage {
                    uri: uri(bucket, key),
                    message: format!("download: truncated: got {} bytes, expected {want}", bytes.len()),
                    permanent: false,
                });
            }
            Ok(bytes)
        }
    }

    /// The whole object of `size` bytes, fetched as ranged GETs of `chunk` bytes, four at
    /// a time, and reassembled in order.
    pub fn get_ranged_parallel(&self, bucket: &str, key: &str, size: u64, chunk: u64) -> Result<Vec<u8>, Error> {
        use futures::StreamExt;
        let ranges: Vec<(u64, u64)> =
            (0..size).step_by(chunk.max(1) as usize).map(|start| (start, chunk.min(size - start))).collect();
        let parts: Vec<Result<Vec<u8>, Error>> = self.rt.block_on(
            futures::stream::iter(
                ranges.into_iter().map(|(start, len)| self.get_async(bucket, key, Some((start, len)), len)),
            )
            .buffered(4)
            .collect(),
        );
        let mut out = Vec::with_capacity(size as usize);
        for p in parts {
            out.extend_from_slice(&p?);
        }
        Ok(out)
    }

    /// Downloads an object of at most `limit` bytes to `path` (atomically).
    pub fn get_file(&self, bucket: &str, key: &str, path: &Path, limit: u64) -> Result<(), Error> {
        let bytes = self.get_bytes(bucket, key, limit)?;
        crate::files::write_atomic(path, &bytes).map_err(io_err(path))
    }

    /// Keys and sizes under `prefix`, all pages.
    pub fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<(String, u64)>, Error> {
        self.rt.block_on(async {
            let mut out = Vec::new();
            let mut pages = self.client.list_objects_v2().bucket(bucket).prefix(prefix).into_paginator().send();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| storage_error(bucket, prefix, "list", e))?;
                for o in page.contents() {
                    out.push((o.key().unwrap_or_default().to_string(), o.size().unwrap_or(0) as u64));
                }
            }
            Ok(out)
        })
    }

    /// The object's size, or `None` when it does not exist.
    pub fn size(&self, bucket: &str, key: &str) -> Result<Option<u64>, Error> {
        match self.rt.block_on(self.client.head_object().bucket(bucket).key(key).send()) {
            Ok(h) => Ok(Some(h.content_length().unwrap_or(0) as u64)),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => Ok(None),
            Err(e) => Err(storage_error(bucket, key, "head", e)),
        }
    }

    /// Uploads every file of `dir` (not recursive) under `prefix`, the manifest last so a
    /// reader never sees a manifest whose shards are missing.
    pub fn put_dir(&self, dir: &Path, bucket: &str, prefix: &str, last: &str) -> Result<usize, Error> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(io_err(dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        files.sort_by_key(|p| (p.file_name().is_some_and(|n| n == last), p.clone()));
        for f in &files {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            self.put_file(bucket, &join(prefix, name), f)?;
        }
        Ok(files.len())
    }
}
