//! A real S3-compatible server for tests: s3s-fs, started per test on 127.0.0.1 with a
//! fresh directory, and clients and trainer environments that reach it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use trainer::storage::{S3, S3Options};

pub const KEY: &str = "AKIATRAINERTEST0001";
pub const SECRET: &str = "trainer-test-secret-key-0123456789abcdef";

pub struct Server {
    child: Child,
    pub endpoint: String,
    pub root: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The s3s-fs binary: `$S3S_FS`, else on PATH, else in ~/.cargo/bin.
pub fn s3s_fs() -> PathBuf {
    if let Some(p) = std::env::var_os("S3S_FS") {
        return p.into();
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let cargo_bin = home.join(".cargo/bin/s3s-fs");
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("s3s-fs"))
        .chain([cargo_bin])
        .find(|p| p.is_file())
        .expect("these tests need the s3s-fs server: scripts/setup-s3.sh installs it (cargo install s3s-fs@0.14.1 --locked --features binary)")
}

pub fn start(buckets: &[&str]) -> Server {
    let root = std::env::temp_dir().join(format!("trainer-s3-{}-{}", std::process::id(), rand_suffix()));
    let _ = std::fs::remove_dir_all(&root);
    for b in buckets {
        std::fs::create_dir_all(root.join(b)).unwrap();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(s3s_fs())
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", KEY, "--secret-key", SECRET])
        .arg(&root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "s3s-fs did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server { child, endpoint: format!("http://127.0.0.1:{port}"), root }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The AWS environment a trainer process needs to reach the test server.
pub fn s3_env(s: &Server) -> [(&'static str, String); 3] {
    [
        ("AWS_ENDPOINT_URL", s.endpoint.clone()),
        ("AWS_ACCESS_KEY_ID", KEY.into()),
        ("AWS_SECRET_ACCESS_KEY", SECRET.into()),
    ]
}

pub fn client(s: &Server, secret: &str) -> S3 {
    S3::with(&S3Options {
        endpoint: Some(s.endpoint.clone()),
        credentials: Some((KEY.into(), secret.into())),
        region: Some("us-east-1".into()),
    })
    .unwrap()
}
