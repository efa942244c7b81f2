//! A preparation shared by workers: the same manifest and samples from 1 worker and from
//! 4, a killed or resized preparation resumed without a document twice, a bad file
//! failing alone, a trained tokenizer published first.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::tests::{docs, options, train_tokens, write_parquet};
use super::*;
use crate::data::shard::{Manifest, ShardSet};
use crate::files::test_util::TempDir;

/// Seven jsonl files of different sizes, a Parquet file and a text file in `dir/in`.
fn inputs(dir: &Path) -> PathBuf {
    let input = dir.join("in");
    std::fs::create_dir_all(input.join("more")).unwrap();
    let docs = docs();
    for f in 0..7 {
        let lines: Vec<String> = (0..(3 + 5 * f))
            .map(|i| json!({"text": format!("file {f} doc {i}: {}", docs[(f * 7 + i) % docs.len()])}).to_string())
            .collect();
        std::fs::write(input.join(format!("web-{f}.jsonl")), lines.join("\n")).unwrap();
    }
    write_parquet(&input.join("more/pdfs.parquet"), &docs);
    std::fs::write(input.join("more/notes.txt"), docs.join("\n\n")).unwrap();
    input
}

fn split_tokens(dir: &Path, validation: bool) -> Vec<u32> {
    let m = Manifest::read(dir).unwrap();
    let entries = if validation { &m.validation } else { &m.train };
    let set = ShardSet::open(dir, entries, &m).unwrap();
    set.shards.iter().flat_map(|s| s.tokens(0, s.len() as usize).into_owned()).collect()
}

fn shared(input: &Path, output: &Path) -> PrepareOptions {
    let mut o = options(vec![input.to_path_buf()], output.to_path_buf());
    o.name = Some("web".into());
    o.validation_fraction = 0.2;
    o.seed = 7;
    o
}

fn run_workers(o: &PrepareOptions, workers: usize, only: impl Fn(usize) -> bool) -> Vec<PrepareReport> {
    (0..workers)
        .filter(|&i| only(i))
        .map(|index| prepare(&PrepareOptions { step: Step::Work { index, workers }, ..o.clone() }).unwrap())
        .collect()
}

fn merged(o: &PrepareOptions) -> Result<PrepareReport, crate::Error> {
    prepare(&PrepareOptions { step: Step::Merge, ..o.clone() })
}

#[test]
fn one_worker_and_four_give_the_same_manifest_and_samples() {
    let dir = TempDir::new("prep-workers");
    let input = inputs(&dir.0);
    let one = shared(&input, &dir.0.join("one"));
    let all = prepare(&one).unwrap();
    assert_eq!((all.files, all.prepared, all.skipped), (9, 9, 0));
    assert!(all.validation_documents > 0 && all.validation_documents < all.documents / 2, "{all:?}");

    let four = shared(&input, &dir.0.join("four"));
    let reports = run_workers(&four, 4, |_| true);
    assert_eq!(reports.iter().map(|r| r.files).sum::<usize>(), 9, "every file by one worker");
    assert!(reports.iter().all(|r| r.files > 0), "{reports:?}");
    assert!(!dir.0.join("four").join(crate::data::shard::MANIFEST).exists(), "workers do not merge");
    let m4 = merged(&four).unwrap();
    assert_eq!(
        (m4.documents, m4.validation_documents, m4.train_tokens),
        (all.documents, all.validation_documents, all.train_tokens)
    );

    let (a, b) = (Manifest::read(&dir.0.join("one")).unwrap(), Manifest::read(&dir.0.join("four")).unwrap());
    assert_eq!(a, b, "the same manifest content");
    for validation in [false, true] {
        assert_eq!(split_tokens(&dir.0.join("one"), validation), split_tokens(&dir.0.join("four"), validation));
    }
    // The same training samples: the mix samples windows of the manifest's token stream.
    let set = |d: &str| ShardSet::open(&dir.0.join(d), &a.train, &a).unwrap();
    let (s1, s4) = (set("one"), set("four"));
    for (x, y) in s1.shards.iter().zip(&s4.shards) {
        assert_eq!(x.tokens(0, x.len() as usize), y.tokens(0, y.len() as usize));
    }
    // Input files are recorded by their path below the input, not where it was mounted.
    let keys: Vec<&str> = a.input["files"].as_array().unwrap().iter().map(|f| f["key"].as_str().unwrap()).collect();
    assert_eq!(keys[..2], ["more/notes.txt", "more/pdfs.parquet"]);
    assert!(!a.input.to_string().contains(dir.0.to_str().unwrap()));
}

#[test]
fn a_killed_or_resized_preparation_resumes_without_a_document_twice() {
    let dir = TempDir::new("prep-resume");
    let input = inputs(&dir.0);
    let reference = shared(&input, &dir.0.join("reference"));
    prepare(&reference).unwrap();

    let o = shared(&input, &dir.0.join("out"));
    // Worker 1 of 3 finishes; worker 0 is killed after its files' shards are written but
    // before the last part's manifest is published: its part is missing, its shards stay.
    run_workers(&o, 3, |i| i <= 1);
    let out = dir.0.join("out");
    let mut parts: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json") && p.file_name().unwrap().to_str().unwrap().starts_with("part-")
        })
        .collect();
    parts.sort();
    assert!(parts.len() >= 2 && parts.len() < 9, "{parts:?}");
    let killed = &parts[0];
    let part: Part = serde_json::from_slice(&std::fs::read(killed).unwrap()).unwrap();
    assert!(part.documents > 0 && part.error.is_none(), "{part:?}");
    std::fs::remove_file(killed).unwrap();
    let e = merged(&o).unwrap_err().to_string();
    let name = killed.file_name().unwrap().to_str().unwrap();
    assert!(e.contains("not prepared") && e.contains(&format!("{name} ({})", part.key)), "{e}");

    // Resized to 2 workers: what is published is skipped, the rest prepared once.
    let resumed = run_workers(&o, 2, |_| true);
    let prepared: usize = resumed.iter().map(|r| r.prepared).sum();
    let skipped: usize = resumed.iter().map(|r| r.skipped).sum();
    assert_eq!(prepared, 1 + 9 - parts.len(), "the killed file and worker 2's files: {resumed:?}");
    assert_eq!(skipped, parts.len() - 1, "{resumed:?}");
    let m = merged(&o).unwrap();
    assert_eq!(Manifest::read(&out).unwrap(), Manifest::read(&dir.0.join("reference")).unwrap());
    assert_eq!(train_tokens(&out), train_tokens(&dir.0.join("reference")));
    assert_eq!(m.documents, prepare(&PrepareOptions { step: Step::Merge, ..reference }).unwrap().documents);

    // Run again whole: nothing is prepared twice.
    let again = prepare(&o).unwrap();
    assert_eq!((again.prepared, again.skipped), (0, 9));
    // Other settings make other parts: another seed, another format asked for.
    let reseeded = prepare(&PrepareOptions { seed: 8, ..o.clone() }).unwrap();
    assert_eq!(reseeded.prepared, 9);
    let as_text =
        PrepareOptions { seed: 8, format: InputFormat::Text, step: Step::Work { index: 0, workers: 1 }, ..o.clone() };
    assert_eq!(prepare(&as_text).unwrap().prepared, 9);
}

#[test]
fn a_bad_file_fails_alone_and_is_named() {
    let dir = TempDir::new("prep-badfile");
    let input = dir.0.join("in");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("a.jsonl"), json!({"text": "good document a"}).to_string()).unwrap();
    std::fs::write(input.join("b.jsonl"), "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n").unwrap();
    std::fs::write(input.join("c.parquet"), b"PAR1 but not really").unwrap();
    std::fs::write(input.join("d.jsonl"), json!({"text": "good document d"}).to_string()).unwrap();
    let mut o = options(vec![input.clone()], dir.0.join("out"));
    let e = prepare(&o).unwrap_err().to_string();
    assert!(e.contains("2 of 4 input files failed (maxFailedFiles 0)"), "{e}");
    assert!(e.contains("b.jsonl") && e.contains("line 2") && e.contains("no field `text`"), "{e}");
    assert!(e.contains("c.parquet") && e.contains("not a Parquet file"), "{e}");
    assert!(!dir.0.join("out").join(crate::data::shard::MANIFEST).exists());
    // b's first document was encoded before its error; none of its shards remain.
    assert!(
        !std::fs::read_dir(dir.0.join("out"))
            .unwrap()
            .any(|e| { e.unwrap().file_name().to_str().unwrap().starts_with("part-00001-") })
    );

    o.max_failed_files = 2;
    let r = prepare(&o).unwrap();
    assert_eq!((r.skipped, r.documents, r.failed.len()), (4, 2, 2), "{r:?}");
    let m = Manifest::read(&dir.0.join("out")).unwrap();
    assert_eq!(m.input["failedFiles"], 2);
    assert!(m.input["files"][2]["error"].as_str().unwrap().contains("not a Parquet file"));
    let tok = crate::data::tokenizer::Tokenizer::embedded().unwrap();
    let text = tok.decode(&train_tokens(&dir.0.join("out")));
    assert!(text.contains("good document a") && text.contains("good document d") && !text.contains("ok"), "{text}");
}

#[test]
fn stray_invalid_utf8_is_replaced_and_more_fails_the_file() {
    let dir = TempDir::new("prep-utf8");
    let mut few = "a clean page of text ".repeat(200).into_bytes();
    few[100] = 0xff;
    std::fs::write(dir.0.join("few.txt"), &few).unwrap();
    let r = prepare(&options(vec![dir.0.join("few.txt")], dir.0.join("a"))).unwrap();
    assert_eq!(r.documents, 1);
    let tok = crate::data::tokenizer::Tokenizer::embedded().unwrap();
    assert!(tok.decode(&train_tokens(&dir.0.join("a"))).contains('\u{fffd}'));
    let mut many = few.clone();
    many[..10].fill(0xfe);
    std::fs::write(dir.0.join("many.txt"), &many).unwrap();
    let e = prepare(&options(vec![dir.0.join("many.txt")], dir.0.join("b"))).unwrap_err().to_string();
    assert!(e.contains("many.txt") && e.contains("11 invalid bytes of 4200"), "{e}");
}

#[test]
fn a_trained_tokenizer_is_published_before_any_worker_starts() {
    let dir = TempDir::new("prep-tok-step");
    let input = inputs(&dir.0);
    let mut o = shared(&input, &dir.0.join("out"));
    o.tokenizer = TokenizerChoice::Train { vocab_size: 300, sample_bytes: 1 << 20 };
    let e = prepare(&PrepareOptions { step: Step::Work { index: 0, workers: 2 }, ..o.clone() }).unwrap_err();
    assert!(e.to_string().contains("train it first with --step tokenizer"), "{e}");
    prepare(&PrepareOptions { step: Step::Tokenizer, ..o.clone() }).unwrap();
    let published = std::fs::read_to_string(dir.0.join("out").join(TOKENIZER_FILE)).unwrap();
    run_workers(&o, 2, |_| true);
    merged(&o).unwrap();
    let m = Manifest::read(&dir.0.join("out")).unwrap();
    let tok = crate::data::tokenizer::Tokenizer::from_json(&published, "published").unwrap();
    assert_eq!(m.tokenizer.hash, tok.hash());
    assert!(tok.vocab_size() <= 300);
    let e = prepare(&PrepareOptions { step: Step::Work { index: 2, workers: 2 }, ..o }).unwrap_err();
    assert!(e.to_string().contains("--worker 2 must be below --workers 2"), "{e}");
}

#[test]
fn the_default_name_is_the_outputs_last_segment() {
    for (output, want) in [
        ("data/web", "web"),
        ("data/web/", "web"),
        ("s3://bucket/prepared/web", "web"),
        ("s3://bucket/prepared/web/", "web"),
        ("s3://bucket", "source"),
        (".", "source"),
    ] {
        assert_eq!(default_name(output), want, "{output}");
    }
}

#[test]
fn the_live_report_counts_each_workers_share_and_the_merge_names_the_manifests_digest() {
    use crds::contract::prepare::PrepareReport as Live;
    use sha2::{Digest, Sha256};
    let dir = TempDir::new("prep-live");
    let input = inputs(&dir.0);
    let o = shared(&input, &dir.0.join("out"));
    let mut shares = Vec::new();
    for index in 0..2 {
        let live = std::sync::Arc::new(std::sync::Mutex::new(Live::default()));
        let w = PrepareOptions { step: Step::Work { index, workers: 2 }, live: Some(live.clone()), ..o.clone() };
        let r = prepare(&w).unwrap();
        let l = live.lock().unwrap().clone();
        assert!(l.done && l.files_total == r.files as u64 && l.files_done == l.files_total, "{l:?}");
        assert_eq!(l.bytes_done, r.input_bytes);
        assert_eq!(l.tokens, r.train_tokens + r.validation_tokens);
        assert_eq!(l.tokens_encoded, l.tokens, "every file encoded now");
        shares.push(l);
    }
    assert_eq!(shares.iter().map(|l| l.files_total).sum::<u64>(), 9, "the shares cover every file once");
    let live = std::sync::Arc::new(std::sync::Mutex::new(Live::default()));
    let m = prepare(&PrepareOptions { step: Step::Merge, live: Some(live.clone()), ..o.clone() }).unwrap();
    let l = live.lock().unwrap().clone();
    let manifest = l.manifest.clone().expect("the merge reports its manifest");
    let bytes = std::fs::read(dir.0.join("out/manifest.json")).unwrap();
    let digest: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(manifest.sha256, digest);
    assert_eq!((manifest.train_tokens, manifest.validation_tokens), (m.train_tokens, m.validation_tokens));
    assert_eq!(l.tokens, shares.iter().map(|s| s.tokens).sum::<u64>());
    assert_eq!(l.tokens_encoded, 0, "the merge encodes nothing");
    // A second run of worker 0 finds its files prepared: counted, not encoded.
    let again = std::sync::Arc::new(std::sync::Mutex::new(Live::default()));
    prepare(&PrepareOptions { step: Step::Work { index: 0, workers: 2 }, live: Some(again.clone()), ..o }).unwrap();
    let a = again.lock().unwrap().clone();
    assert_eq!((a.files_done, a.tokens, a.tokens_encoded), (shares[0].files_done, shares[0].tokens, 0));
}
