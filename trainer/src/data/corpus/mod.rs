//! The embedded synthetic corpus: four deterministic, learnable sources generated from
//! templates (`textbook`, `facts`, `arithmetic`, `mcq`).
//!
//! Everything is driven by `ChaCha8Rng` through [`Rng`], which only uses `next_u64`, so
//! the bytes do not depend on `rand`'s distribution algorithms and are identical on every
//! machine. Bump [`CORPUS_VERSION`] whenever the output changes (the pinned hashes in the
//! tests catch accidental changes); caches of tokenizers and token streams are keyed by it.

mod arithmetic;
mod facts;
mod mcq;
mod rng;
mod textbook;

use crate::Error;
pub use crate::data::mcq::McqRecord;
use crate::data::split::split_of;
pub use crate::data::split::{Split, VALIDATION_MODULUS};
use arithmetic::arithmetic_doc;
use facts::{facts_doc, world};
use mcq::mcq_record;
use rng::Rng;
use textbook::textbook_doc;

/// Version of the generators' output; part of every cache key derived from the corpus.
pub const CORPUS_VERSION: u32 = 2;

/// Names of the sources: the contract's list, which the resolver checks manifests against.
pub const SOURCES: [&str; 4] = crds::contract::EMBEDDED_SOURCES;

/// Generates documents of `source` until their total size reaches `n_bytes` (the last
/// document may overshoot). A larger `n_bytes` extends the same stream.
pub fn documents(source: &str, seed: u64, split: Split, n_bytes: usize) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    let mut total = 0;
    for doc in stream(source, seed, split)? {
        if total >= n_bytes {
            break;
        }
        total += doc.len();
        out.push(doc);
    }
    Ok(out)
}

/// The endless document stream of `source`; [`documents`] takes a prefix of it.
pub fn stream(source: &str, seed: u64, split: Split) -> Result<DocStream, Error> {
    let kind = source_index(source)?;
    Ok(DocStream { kind, rng: Rng::new(seed, (kind as u64) * 2 + split.index()), split })
}

/// The index of `source` in [`SOURCES`], or an error naming it and the valid names.
pub fn source_index(source: &str) -> Result<usize, Error> {
    SOURCES.iter().position(|s| *s == source).ok_or_else(|| Error::Data {
        name: source.to_string(),
        message: format!("no embedded source of that name; valid names are {}", SOURCES.join(", ")),
    })
}

/// Iterator over the documents of one source and split; see [`stream`].
pub struct DocStream {
    kind: usize,
    rng: Rng,
    split: Split,
}

impl Iterator for DocStream {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        let w = world();
        let source = SOURCES[self.kind];
        if source == "mcq" {
            return Some(mcq_record(&mut self.rng, w, self.split, false).text());
        }
        loop {
            let doc = match source {
                "textbook" => textbook_doc(&mut self.rng),
                "facts" => facts_doc(&mut self.rng, w),
                "arithmetic" => arithmetic_doc(&mut self.rng),
                other => unreachable!("embedded source {other} has no generator"),
            };
            if split_of(&doc) == self.split {
                return Some(doc);
            }
        }
    }
}

/// The first `n` multiple-choice records of the `mcq` stream for `seed` and `split`
/// (the same records, as text, that `documents("mcq", seed, split, ..)` yields).
pub fn mcq_records(seed: u64, n: usize, split: Split) -> Vec<McqRecord> {
    let mut rng = Rng::new(seed, 3 * 2 + split.index());
    (0..n).map(|_| mcq_record(&mut rng, world(), split, false)).collect()
}

/// The first `n` rule questions for `seed` and `split` (the `mcq-rules` GRPO task): each
/// names its answer's position, as a fifth of the `mcq` stream's questions do.
pub fn mcq_rule_records(seed: u64, n: usize, split: Split) -> Vec<McqRecord> {
    let mut rng = Rng::new(seed, 4 * 2 + split.index());
    (0..n).map(|_| mcq_record(&mut rng, world(), split, true)).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use sha2::{Digest, Sha256};

    use super::facts::N_TOWNS;
    use super::*;

    fn head_hash(source: &str) -> String {
        let docs = documents(source, 0, Split::Train, 4096).unwrap();
        let joined = docs.join("\n\u{0}");
        let hex: String = Sha256::digest(&joined.as_bytes()[..4096]).iter().map(|b| format!("{b:02x}")).collect();
        hex[..16].to_string()
    }

    #[test]
    fn pinned_output() {
        // Changing a generator changes these: bump CORPUS_VERSION, then update them.
        let got: Vec<(&str, String)> = SOURCES.iter().map(|s| (*s, head_hash(s))).collect();
        let want = [
            ("textbook", "0d9dc09c4b064aee"),
            ("facts", "bd2ec585162c754b"),
            ("arithmetic", "3a997764dabad000"),
            ("mcq", "b4d6f890ec4f1785"),
        ]
        .map(|(s, h)| (s, h.to_string()));
        assert_eq!(got, want, "the corpus output changed");
    }

    #[test]
    #[ignore = "prints sample documents: cargo test -p trainer --lib show_samples -- --ignored --nocapture"]
    fn show_samples() {
        for s in SOURCES {
            for d in documents(s, 0, Split::Train, 1500).unwrap() {
                println!("[{s}] {d}\n");
            }
        }
    }

    #[test]
    fn deterministic_and_prefix_stable() {
        for s in SOURCES {
            let a = documents(s, 7, Split::Train, 20_000).unwrap();
            let b = documents(s, 7, Split::Train, 40_000).unwrap();
            assert!(a.iter().map(String::len).sum::<usize>() >= 20_000);
            assert_eq!(a[..], b[..a.len()], "{s}");
        }
    }

    #[test]
    fn splits_and_seeds_differ() {
        for s in SOURCES {
            let train: BTreeSet<String> = documents(s, 0, Split::Train, 50_000).unwrap().into_iter().collect();
            let val = documents(s, 0, Split::Validation, 50_000).unwrap();
            let other_seed = documents(s, 1, Split::Train, 5_000).unwrap();
            assert_ne!(other_seed[..], documents(s, 0, Split::Train, 5_000).unwrap()[..], "{s}");
            assert!(val.iter().all(|d| !train.contains(d)), "{s}: a validation document is in train");
        }
        let key = |r: &McqRecord| format!("{}\n{}", r.question, r.options[r.answer]);
        let train: BTreeSet<String> = mcq_records(0, 2000, Split::Train).iter().map(key).collect();
        let val = mcq_records(0, 500, Split::Validation);
        assert!(val.iter().all(|r| !train.contains(&key(r)) && r.split() == Split::Validation));
    }

    #[test]
    fn unknown_source_names_it_and_the_valid_ones() {
        let e = documents("poems", 0, Split::Train, 10).unwrap_err().to_string();
        assert!(e.contains("poems") && SOURCES.iter().all(|s| e.contains(s)), "{e}");
    }

    /// Rule questions name their answer's position, and every position occurs.
    #[test]
    fn rule_questions_answer_the_position_they_name() {
        let mut seen = [0; 4];
        for r in mcq_rule_records(2, 600, Split::Train) {
            let named = (r.question.as_bytes()[r.question.len() - 2] - b'A') as usize;
            let want = if r.question.contains("after") {
                named + 1
            } else if r.question.contains("before") {
                named - 1
            } else {
                named
            };
            assert_eq!(r.answer, want, "{}", r.text());
            seen[r.answer] += 1;
        }
        assert!(seen.iter().all(|&n| n > 100), "{seen:?}");
        let val = mcq_rule_records(2, 50, Split::Validation);
        assert!(val.iter().all(|r| r.split() == Split::Validation));
    }

    #[test]
    fn mcq_format_answers_and_letters() {
        let recs = mcq_records(3, 4000, Split::Train);
        let mut per_letter = [0usize; 4];
        for r in &recs {
            per_letter[r.answer] += 1;
            let distinct: BTreeSet<&String> = r.options.iter().collect();
            assert_eq!(distinct.len(), 4, "{r:?}");
            let text = r.text();
            assert!(
                text.starts_with("Question: ") && text.ends_with(&format!("\nAnswer: {}", McqRecord::letter(r.answer)))
            );
            assert_eq!(text.lines().count(), 6);
            assert_eq!(&text[..r.prompt().len()], r.prompt());
            // Arithmetic answers are right.
            let expr = r.question.strip_prefix("What is ").and_then(|q| q.strip_suffix('?')).unwrap_or("");
            let t: Vec<&str> = expr.split(' ').collect();
            if let [a, _, b] = t[..]
                && let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>())
            {
                let v = match t[1] {
                    "+" => a + b,
                    "-" => a - b,
                    _ => a * b,
                };
                assert_eq!(r.options[r.answer], v.to_string(), "{r:?}");
            }
        }
        for n in per_letter {
            assert!((900..1100).contains(&n), "{per_letter:?}");
        }
        // The documents are the records' text.
        let docs = documents("mcq", 3, Split::Train, 2000).unwrap();
        assert_eq!(docs[0], recs[0].text());
        assert_eq!(docs[1], recs[1].text());
    }

    #[test]
    fn arithmetic_statements_are_correct() {
        for doc in documents("arithmetic", 5, Split::Train, 100_000).unwrap() {
            for line in doc.lines() {
                // Every "a op b = c" in the text holds.
                let t: Vec<&str> = line.split(' ').collect();
                for i in 0..t.len().saturating_sub(4) {
                    if t[i + 3] != "=" {
                        continue;
                    }
                    let num = |s: &str| s.trim_end_matches('.').parse::<i64>().unwrap();
                    let (a, b, c) = (num(t[i]), num(t[i + 2]), num(t[i + 4]));
                    let v = match t[i + 1] {
                        "+" => a + b,
                        "-" => a - b,
                        "*" => a * b,
                        op => panic!("operator {op} in {line}"),
                    };
                    assert_eq!(v, c, "{line}");
                }
            }
        }
    }

    #[test]
    fn facts_are_consistent() {
        // Every statement of a town's founding year agrees with every other.
        let mut years = std::collections::BTreeMap::new();
        for doc in documents("facts", 11, Split::Train, 200_000).unwrap() {
            for sent in doc.split(". ") {
                if let Some((town, year)) =
                    sent.split_once(" was founded in the year ").or_else(|| sent.split_once(" was founded in "))
                {
                    let year = year.split([' ', '.']).next().unwrap().to_string();
                    if town == "It" {
                        continue;
                    }
                    if let Some(prev) = years.insert(town.to_string(), year.clone()) {
                        assert_eq!(prev, year, "{town}");
                    }
                }
            }
        }
        assert!(years.len() >= N_TOWNS, "{years:?}");
    }
}
