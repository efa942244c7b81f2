//! `trainer prepare` end to end: formats, the validation split, MedQA records, a trained
//! tokenizer and the errors bad inputs give.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::*;
use crate::data::mcq::{McqRecord, medqa_json, parse_medqa};
use crate::data::shard::{Dtype, Manifest, ShardSet};
use crate::data::tokenizer::Tokenizer;
use crate::files::test_util::TempDir;

pub(super) fn docs() -> Vec<String> {
    (0..40)
        .map(|i| {
            format!(
                "Document {i}: the river Belmora runs {} miles past {} towns.\nSecond line, ünïcode ✓.",
                i * 3,
                i % 7
            )
        })
        .collect()
}

pub(super) fn options(inputs: Vec<PathBuf>, output: PathBuf) -> PrepareOptions {
    PrepareOptions {
        inputs: inputs.iter().map(|p| p.display().to_string()).collect(),
        output: output.display().to_string(),
        name: None,
        format: InputFormat::Auto,
        field: "text".into(),
        tokenizer: TokenizerChoice::Embedded,
        shard_tokens: 1024,
        validation_fraction: 0.0,
        seed: 0,
        max_failed_files: 0,
        step: Step::All,
        progress: false,
        live: None,
    }
}

pub(super) fn train_tokens(dir: &Path) -> Vec<u32> {
    let m = Manifest::read(dir).unwrap();
    let set = ShardSet::open(dir, &m.train, &m).unwrap();
    set.shards.iter().flat_map(|s| s.tokens(0, s.len() as usize).into_owned()).collect()
}

/// A Parquet file of `texts` in a `text` column (the integration tests' own writer).
pub(super) fn write_parquet(path: &Path, texts: &[String]) {
    parquet_fixture::write_texts(path, texts);
}

#[path = "../../../tests/common/parquet.rs"]
mod parquet_fixture;

#[test]
fn jsonl_parquet_and_text_give_the_same_tokens() {
    let dir = TempDir::new("prep-formats");
    let docs = docs();
    let jsonl = dir.0.join("in.jsonl");
    let lines: Vec<String> = docs.iter().map(|d| json!({"id": 1, "body": d}).to_string()).collect();
    std::fs::write(&jsonl, lines.join("\n") + "\n\n").unwrap();
    let parquet = dir.0.join("in.parquet");
    write_parquet(&parquet, &docs);
    let text_dir = dir.0.join("texts");
    std::fs::create_dir_all(text_dir.join("sub")).unwrap();
    for (i, d) in docs.iter().enumerate() {
        // Path order is document order, and subdirectories are walked.
        let file = if i < 30 {
            text_dir.join(format!("{i:03}.txt"))
        } else {
            text_dir.join("sub").join(format!("{i:03}.txt"))
        };
        std::fs::write(file, d).unwrap();
    }
    std::fs::write(text_dir.join(".hidden.txt"), "skipped").unwrap();

    let mut o = options(vec![jsonl], dir.0.join("a"));
    o.field = "body".into();
    let ra = prepare(&o).unwrap();
    let mut o = options(vec![parquet], dir.0.join("b"));
    let rb = prepare(&o).unwrap();
    o = options(vec![text_dir], dir.0.join("c"));
    let rc = prepare(&o).unwrap();
    assert_eq!((ra.documents, rb.documents, rc.documents), (40, 40, 40));
    let a = train_tokens(&dir.0.join("a"));
    assert_eq!(a, train_tokens(&dir.0.join("b")));
    assert_eq!(a, train_tokens(&dir.0.join("c")));
    let tok = Tokenizer::embedded().unwrap();
    assert_eq!(a.iter().filter(|&&t| t == tok.eos_id()).count(), 40);
    let first_doc: Vec<u32> = a.iter().take_while(|&&t| t != tok.eos_id()).copied().collect();
    assert_eq!(tok.decode(&first_doc), docs[0]);
    // Fixed-size shards: all but the last hold exactly --shard-tokens.
    let m = Manifest::read(&dir.0.join("a")).unwrap();
    assert!(m.train.len() > 1);
    assert!(m.train[..m.train.len() - 1].iter().all(|e| e.tokens == 1024));
    assert_eq!(Manifest::tokens(&m.train), a.len() as u64);
}

#[test]
fn the_validation_split_is_deterministic_and_near_its_fraction() {
    let dir = TempDir::new("prep-split");
    let input = dir.0.join("in.jsonl");
    let lines: Vec<String> = (0..2000).map(|i| json!({"text": format!("doc {i}")}).to_string()).collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let mut o = options(vec![input.clone()], dir.0.join("a"));
    o.validation_fraction = 0.1;
    let r = prepare(&o).unwrap();
    assert!((150..=250).contains(&r.validation_documents), "{}", r.validation_documents);
    o.output = dir.0.join("b").display().to_string();
    prepare(&o).unwrap();
    let (a, b) = (Manifest::read(&dir.0.join("a")).unwrap(), Manifest::read(&dir.0.join("b")).unwrap());
    assert_eq!((&a.train, &a.validation), (&b.train, &b.validation));
    o.output = dir.0.join("c").display().to_string();
    o.seed = 1;
    prepare(&o).unwrap();
    assert_ne!(
        Manifest::read(&dir.0.join("c")).unwrap().validation,
        b.validation,
        "another seed holds out other documents"
    );
}

#[test]
fn medqa_becomes_text_for_pretraining_and_records_for_grpo() {
    let dir = TempDir::new("prep-medqa");
    let input = dir.0.join("medqa.jsonl");
    let recs: Vec<McqRecord> = (0..60)
        .map(|i| {
            McqRecord::new(
                format!("A {i}-year-old presents with fever. Next step?"),
                vec!["Observe".into(), format!("Drug {i}"), "Surgery".into(), "Discharge".into()],
                i % 4,
            )
        })
        .collect();
    let lines: Vec<String> = recs.iter().map(|r| medqa_json(r).to_string()).collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let mut o = options(vec![input], dir.0.join("out"));
    o.validation_fraction = 0.2;
    let r = prepare(&o).unwrap();
    let m = Manifest::read(&dir.0.join("out")).unwrap();
    let files = m.records.clone().expect("MedQA keeps its records");
    let read = |f: &str| -> Vec<McqRecord> {
        std::fs::read_to_string(dir.0.join("out").join(f))
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| parse_medqa(&serde_json::from_str(l).unwrap()).unwrap())
            .collect()
    };
    let (train, val) = (read(&files.train), read(&files.validation));
    assert_eq!(val.len() as u64, r.validation_documents);
    assert_eq!(train.len() + val.len(), 60);
    let mut all: Vec<McqRecord> = train.into_iter().chain(val).collect();
    all.sort_by_key(|r| r.options[1].clone());
    let mut want = recs.clone();
    want.sort_by_key(|r| r.options[1].clone());
    assert_eq!(all, want);
    // The pretraining text is the prompt and the gold letter.
    let tok = Tokenizer::embedded().unwrap();
    let text = tok.decode(&train_tokens(&dir.0.join("out")));
    assert!(text.contains("Question: A 0-year-old presents with fever. Next step?\nA. Observe\nB. Drug 0\nC. Surgery\nD. Discharge\nAnswer: A"), "{text}");
}

#[test]
fn a_trained_tokenizer_is_written_beside_the_shards() {
    let dir = TempDir::new("prep-bpe");
    let input = dir.0.join("in.txt");
    std::fs::write(&input, docs().join("\n\n")).unwrap();
    let mut o = options(vec![input], dir.0.join("out"));
    o.tokenizer = TokenizerChoice::Train { vocab_size: 300, sample_bytes: 1 << 20 };
    prepare(&o).unwrap();
    let m = Manifest::read(&dir.0.join("out")).unwrap();
    let tok = Tokenizer::from_file(dir.0.join("out/tokenizer.json")).unwrap();
    assert_eq!((tok.hash(), tok.vocab_size(), tok.eos_id()), (m.tokenizer.hash.clone(), m.tokenizer.vocab_size, 0));
    assert!(tok.vocab_size() <= 300);
    assert_eq!(m.dtype, Dtype::U16);
    assert_eq!(tok.decode(&train_tokens(&dir.0.join("out"))[..5]), tok.decode(&tok.encode(&docs()[0])[..5]));
}

#[test]
fn bad_inputs_name_the_file_the_line_and_the_field() {
    let dir = TempDir::new("prep-bad");
    let err = |name: &str, body: &[u8], field: &str| {
        let path = dir.0.join(name);
        std::fs::write(&path, body).unwrap();
        let mut o = options(vec![path], dir.0.join(format!("out-{name}")));
        o.field = field.into();
        prepare(&o).unwrap_err().to_string()
    };
    let e = err("a.jsonl", b"{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n", "text");
    assert!(e.contains("a.jsonl") && e.contains("line 2") && e.contains("no field `text`"), "{e}");
    let e = err("b.jsonl", b"{\"text\": 5}\n", "text");
    assert!(e.contains("b.jsonl") && e.contains("line 1") && e.contains("not a string"), "{e}");
    let e = err("c.jsonl", b"{not json\n", "text");
    assert!(e.contains("c.jsonl") && e.contains("not JSON"), "{e}");
    let e = err(
        "d.jsonl",
        br#"{"question": "q", "options": {"A": "a", "B": "b", "C": "c", "D": "d"}, "answer_idx": "E"}"#,
        "text",
    );
    assert!(e.contains("d.jsonl") && e.contains("answer_idx") && e.contains("\"E\""), "{e}");
    let e = err("e.jsonl", br#"{"question": "q", "options": {"A": "a", "C": "c"}, "answer_idx": "A"}"#, "text");
    assert!(e.contains("options.B"), "{e}");
    let e = err("f.txt", &[0x66, 0xff, 0xfe, 0x00], "text");
    assert!(e.contains("f.txt") && e.contains("not UTF-8"), "{e}");
    let path = dir.0.join("g.parquet");
    write_parquet(&path, &docs());
    let mut o = options(vec![path], dir.0.join("out-g"));
    o.field = "content".into();
    let e = prepare(&o).unwrap_err().to_string();
    assert!(e.contains("g.parquet") && e.contains("no column `content`") && e.contains("id, text"), "{e}");
    let e = err("h.parquet", b"PAR1 but not really", "text");
    assert!(e.contains("h.parquet") && e.contains("not a Parquet file"), "{e}");
    let mut o = options(vec![dir.0.join("missing.jsonl")], dir.0.join("out-m"));
    o.validation_fraction = 0.0;
    assert!(prepare(&o).unwrap_err().to_string().contains("missing.jsonl"));
}
