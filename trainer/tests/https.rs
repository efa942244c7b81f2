//! `trainer prepare` on `https://` inputs and an `https://` tokenizer, served over TLS by a
//! local server whose CA the trainer learns from `SSL_CERT_FILE`: the same manifest and
//! shards as the same files on disk, by one process and by two workers; each refusal
//! names its URL.

use std::path::{Path, PathBuf};
use std::process::Output;

use crds::contract::FailureReason;

mod common;
use common::{https, parquet, scratch, trainer_bin};

/// The licence texts' paragraphs: real prose, a few hundred KB.
fn paragraphs() -> Vec<String> {
    let mut out = Vec::new();
    let mut names: Vec<PathBuf> =
        std::fs::read_dir("/usr/share/common-licenses").unwrap().flatten().map(|e| e.path()).collect();
    names.sort();
    for p in names.iter().filter(|p| p.is_file()) {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        out.extend(text.split("\n\n").map(str::trim).filter(|t| t.len() > 40).map(str::to_string));
    }
    assert!(out.len() > 300, "{} paragraphs", out.len());
    out
}

/// The served directory: a jsonl, a Parquet and a text file, and a tokenizer trained on them.
fn files(dir: &Path) -> PathBuf {
    let served = dir.join("served");
    std::fs::create_dir_all(&served).unwrap();
    let p = paragraphs();
    let third = p.len() / 3;
    let jsonl: String = p[..third].iter().map(|t| serde_json::json!({ "text": t }).to_string() + "\n").collect();
    std::fs::write(served.join("a.jsonl"), jsonl).unwrap();
    parquet::write_texts(&served.join("b.parquet"), &p[third..2 * third]);
    std::fs::write(served.join("c.txt"), p[2 * third..].join("\n\n")).unwrap();
    let tok = dir.join("tok");
    let o = trainer_bin()
        .args(["prepare", "--train-tokenizer", "--vocab-size", "512", "--step", "tokenizer", "-o"])
        .arg(&tok)
        .args(["-i", "a.jsonl", "-i", "b.parquet", "-i", "c.txt"])
        .current_dir(&served)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::copy(tok.join("tokenizer.json"), served.join("tokenizer.json")).unwrap();
    served
}

const DATA: [&str; 3] = ["a.jsonl", "b.parquet", "c.txt"];

fn prepare(inputs: &[String], tokenizer: &str, out: &Path, extra: &[&str], ca: Option<&Path>) -> Output {
    let mut cmd = trainer_bin();
    cmd.arg("prepare");
    for i in inputs {
        cmd.args(["-i", i]);
    }
    cmd.args(["--tokenizer", tokenizer, "--shard-tokens", "4K", "--validation-fraction", "0.1", "--seed", "7"])
        .args(["--name", "licences", "-o"])
        .arg(out)
        .args(extra)
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR");
    if let Some(ca) = ca {
        cmd.env("SSL_CERT_FILE", ca);
    }
    cmd.output().unwrap()
}

fn ok(o: &Output) -> &Output {
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    o
}

/// The prepared output's files (the manifest and the shards), by name.
fn outputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n == "manifest.json" || n.ends_with(".bin"))
        .map(|n| (n.clone(), std::fs::read(dir.join(&n)).unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn https_inputs_prepare_as_the_same_files_on_disk() {
    let dir = scratch("https");
    let served = files(&dir);
    let server = https::serve(&served, &dir.join("pki"));
    let local: Vec<String> = DATA.iter().map(|n| served.join(n).display().to_string()).collect();
    let remote: Vec<String> = DATA.iter().map(|n| server.url(n)).collect();

    ok(&prepare(&local, &served.join("tokenizer.json").display().to_string(), &dir.join("local"), &[], None));
    let o = prepare(&remote, &server.url("tokenizer.json"), &dir.join("remote"), &[], Some(&server.ca_pem));
    let stdout = String::from_utf8_lossy(&ok(&o).stdout);
    assert!(stdout.contains("3 files (3 prepared"), "{stdout}");
    let expected = outputs(&dir.join("local"));
    assert!(expected.len() > 3, "{:?}", expected.iter().map(|(n, _)| n).collect::<Vec<_>>());
    assert_eq!(outputs(&dir.join("remote")), expected, "the https output differs from the local one");
    // Nothing fetched was left in the output's work directory.
    let leftovers: Vec<String> = std::fs::read_dir(dir.join("remote"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".input-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Two workers, each listing every URL (HEAD) and fetching only its own files, then
    // the merge: the same manifest and shards.
    let before = server.requests.lock().unwrap().clone();
    let workers = dir.join("workers");
    for w in ["0", "1"] {
        let extra = ["--step", "work", "--workers", "2", "--worker", w];
        ok(&prepare(&remote, &server.url("tokenizer.json"), &workers, &extra, Some(&server.ca_pem)));
    }
    ok(&prepare(&remote, &server.url("tokenizer.json"), &workers, &["--step", "merge"], Some(&server.ca_pem)));
    assert_eq!(outputs(&workers), expected, "two workers' output differs from the local one");
    let after = server.requests.lock().unwrap().clone();
    let delta = |k: &str| after.get(k).copied().unwrap_or(0) - before.get(k).copied().unwrap_or(0);
    for n in DATA {
        assert_eq!(delta(&format!("GET /{n}")), 1, "{n} fetched once by the workers: {after:?}");
        assert_eq!(delta(&format!("HEAD /{n}")), 3, "{n} listed by each worker and the merge: {after:?}");
    }
}

#[test]
fn https_refusals_name_the_url() {
    let dir = scratch("https-refused");
    let served = files(&dir);
    let server = https::serve(&served, &dir.join("pki"));
    let tok = served.join("tokenizer.json").display().to_string();
    let data_error = Some(FailureReason::DataError.exit_code());

    // A CA the trainer was not told of.
    let o = prepare(&[server.url("a.jsonl")], &tok, &dir.join("untrusted"), &[], None);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains(&server.url("a.jsonl")), "{stderr}");
    assert!(stderr.contains("certificate") || stderr.contains("UnknownIssuer"), "{stderr}");

    // A file the server does not have: permanent, a data error naming the URL and the status.
    let missing = server.url("missing.jsonl");
    let o = prepare(std::slice::from_ref(&missing), &tok, &dir.join("missing"), &[], Some(&server.ca_pem));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains(&missing) && stderr.contains("404"), "{stderr}");
    assert_eq!(o.status.code(), data_error, "{stderr}");

    // A tokenizer URL that is not there.
    let o = prepare(&[server.url("a.jsonl")], &server.url("nope.json"), &dir.join("tok404"), &[], Some(&server.ca_pem));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains(&server.url("nope.json")) && stderr.contains("404"), "{stderr}");

    // Plain http is refused before anything is fetched.
    let plain = server.url("a.jsonl").replace("https://", "http://");
    let o = prepare(std::slice::from_ref(&plain), &tok, &dir.join("plain"), &[], Some(&server.ca_pem));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains(&plain) && stderr.contains("plain http is refused"), "{stderr}");
    assert!(!dir.join("plain").join("manifest.json").exists());
}
