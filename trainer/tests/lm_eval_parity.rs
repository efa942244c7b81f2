//! `trainer eval --task mcq` against lm-evaluation-harness itself: the same exported
//! checkpoint, the same question files, lm-eval's `hf` model (from PyPI, unmodified;
//! `scripts/lm_eval_parity.py`) on a task YAML per format written from the files, as
//! lm-eval's own task files define them. For every question: the same context (the
//! template and the few-shot examples, in order, for the seed 1234), the same
//! continuations, every option's log-likelihood within 1e-4, and the same acc and
//! acc_norm picks; and the same aggregate scores.
//!
//! Needs lm_eval in the test Python (`scripts/setup-pytorch-ref.sh`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use trainer::eval::Sample;

mod common;
use common::{python, trainer_bin};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcq").join(name)
}

/// A format's comparison: the question file, the few-shot examples' file and their
/// number, and the lm-eval tasks that ask the same questions.
struct Case {
    name: &'static str,
    format: &'static str,
    questions: &'static str,
    shots_from: &'static str,
    shots: usize,
}

const CASES: [Case; 4] = [
    Case { name: "mmlu", format: "mmlu", questions: "mmlu_test.jsonl", shots_from: "mmlu_dev.jsonl", shots: 2 },
    Case { name: "arc", format: "arc", questions: "arc_easy.jsonl", shots_from: "arc_easy.jsonl", shots: 2 },
    Case { name: "medqa_4", format: "medqa", questions: "medqa_4.jsonl", shots_from: "medqa_4.jsonl", shots: 3 },
    Case { name: "medqa_5", format: "medqa", questions: "medqa_5.jsonl", shots_from: "medqa_5.jsonl", shots: 1 },
];

/// lm-eval's `mmlu/default/_default_template_yaml`, for one subject's files.
fn mmlu_task(subject: &str, test: &Path, dev: &Path, shots: usize) -> Value {
    json!({
        "task": format!("mmlu_{subject}"),
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": test, "dev": dev}},
        "test_split": "test",
        "fewshot_split": "dev",
        "fewshot_config": {"sampler": "first_n"},
        "num_fewshot": shots,
        "output_type": "multiple_choice",
        "description": format!("The following are multiple choice questions (with answers) about {}.\n\n",
            subject.replace('_', " ")),
        "doc_to_text": "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\nD. {{choices[3]}}\nAnswer:",
        "doc_to_choice": ["A", "B", "C", "D"],
        "doc_to_target": "answer",
    })
}

/// A task whose few-shot examples come from its own questions (lm-eval draws k + 1 and
/// drops the question): lm-eval's `arc_easy.yaml`, or its `medqa_4options` template for
/// MedQA's lettered options (here any number of them).
fn own_task(name: &str, format: &str, file: &Path, shots: usize) -> Value {
    let (text, choice, target) = match format {
        "arc" => ("Question: {{question}}\nAnswer:", "{{choices.text}}", "{{choices.label.index(answerKey)}}"),
        _ => (
            "Question: {{question}}\n{% for letter, text in options.items() %}{{letter}}. {{text}}\n{% endfor %}Answer:",
            "{{options.keys() | list}}",
            "{{(options.keys() | list).index(answer_idx)}}",
        ),
    };
    json!({
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": file}},
        "test_split": "test",
        "fewshot_split": "test",
        "num_fewshot": shots,
        "output_type": "multiple_choice",
        "doc_to_text": text,
        "doc_to_choice": choice,
        "doc_to_target": target,
    })
}

/// Writes the case's lm-eval tasks into `tasks` (MMLU: one per subject, with its own
/// files, as lm-eval's `mmlu` group has); returns their names.
fn write_tasks(c: &Case, tasks: &Path) -> Vec<String> {
    let metrics = json!([
        {"metric": "acc", "aggregation": "mean", "higher_is_better": true},
        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": true},
    ]);
    let mut written = Vec::new();
    let mut write = |mut task: Value| {
        task["metric_list"] = metrics.clone();
        let name = task["task"].as_str().unwrap().to_string();
        std::fs::write(tasks.join(format!("{name}.yaml")), serde_json::to_string_pretty(&task).unwrap()).unwrap();
        written.push(name);
    };
    if c.format != "mmlu" {
        write(own_task(c.name, c.format, &fixture(c.questions), c.shots));
        return written;
    }
    let by_subject = |file: &str| -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = BTreeMap::new();
        for line in std::fs::read_to_string(fixture(file)).unwrap().lines() {
            let subject = serde_json::from_str::<Value>(line).unwrap()["subject"].as_str().unwrap().to_string();
            *out.entry(subject).or_default() += &format!("{line}\n");
        }
        out
    };
    let (test, dev) = (by_subject(c.questions), by_subject(c.shots_from));
    for (subject, lines) in &test {
        let (t, d) =
            (tasks.join(format!("mmlu_{subject}_test.jsonl")), tasks.join(format!("mmlu_{subject}_dev.jsonl")));
        std::fs::write(&t, lines).unwrap();
        std::fs::write(&d, &dev[subject]).unwrap();
        write(mmlu_task(subject, &t, &d, c.shots));
    }
    written
}

/// `trainer eval` on the case's files: its JSON report and its samples.
fn ours(run: &Path, c: &Case, out: &Path) -> (Value, Vec<Sample>) {
    let samples = out.join(format!("{}-samples.jsonl", c.name));
    let shots = c.shots.to_string();
    let output = trainer_bin()
        .args(["eval", "--task", "mcq", "--json", "--max-new-tokens", "0", "--format", c.format, "--fewshot", &shots])
        .arg("--dataset")
        .arg(fixture(c.questions))
        .arg("--fewshot-dataset")
        .arg(fixture(c.shots_from))
        .arg("--samples")
        .arg(&samples)
        .arg(run)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let samples = std::fs::read_to_string(samples).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (report, samples)
}

#[test]
fn lm_evaluation_harness_scores_every_question_the_same() {
    let root = common::grpo_base("lm-eval-parity");
    let (run, hf, tasks) = (root.join("base"), root.join("hf"), root.join("tasks"));
    let export = trainer_bin().arg("export").arg(&run).arg("--hf").arg(&hf).output().unwrap();
    assert!(export.status.success(), "{}", String::from_utf8_lossy(&export.stderr));
    std::fs::create_dir_all(&tasks).unwrap();
    let names: Vec<Vec<String>> = CASES.iter().map(|c| write_tasks(c, &tasks)).collect();

    let report = root.join("lm-eval.json");
    let out = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/lm_eval_parity.py"))
        .args([&hf, &tasks, &report])
        .args(names.iter().flatten())
        .output()
        .expect("python runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "lm_eval failed:\n{stdout}\n{stderr}");
    let theirs: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();

    let mut worst = 0.0f64;
    for (c, tasks) in CASES.iter().zip(&names) {
        let (score, samples) = ours(&run, c, &root);
        // lm-eval's samples in our order: each task's in doc order, MMLU's subject by subject.
        let mut theirs_by_subject: BTreeMap<String, std::vec::IntoIter<Value>> = BTreeMap::new();
        for t in tasks {
            let subject = t.strip_prefix("mmlu_").unwrap_or("").to_string();
            theirs_by_subject.insert(subject, theirs[t]["samples"].as_array().unwrap().clone().into_iter());
        }
        assert_eq!(samples.len(), theirs_by_subject.values().map(|s| s.len()).sum::<usize>(), "{}", c.name);
        let (mut acc, mut acc_norm) = (0.0, 0.0);
        for s in &samples {
            let key = if c.format == "mmlu" { s.subject.clone().unwrap() } else { String::new() };
            let t = theirs_by_subject.get_mut(&key).unwrap().next().unwrap();
            let what = format!("{} question {}", c.name, s.doc_id);
            assert_eq!(s.context, t["context"].as_str().unwrap(), "{what}: the context");
            assert!(s.context.matches("Answer: ").count() >= c.shots, "{what}: {} examples asked", c.shots);
            let continuations: Vec<String> = s.choices.iter().map(|x| format!(" {x}")).collect();
            assert_eq!(t["continuations"], json!(continuations), "{what}");
            assert_eq!(s.target as u64, t["target"].as_u64().unwrap(), "{what}: the target");
            let theirs: Vec<f64> =
                t["loglikelihoods"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            for (ours, theirs) in s.loglikelihoods.iter().zip(&theirs) {
                let diff = (ours - theirs).abs();
                assert!(diff <= 1e-4 * theirs.abs().max(1.0), "{what}: log-likelihood {ours} vs lm-eval {theirs}");
                worst = worst.max(diff / theirs.abs().max(1.0));
            }
            assert_eq!(s.loglikelihoods.len(), theirs.len(), "{what}");
            assert_eq!(f64::from(u8::from(s.acc)), t["acc"].as_f64().unwrap(), "{what}: acc");
            assert_eq!(f64::from(u8::from(s.acc_norm)), t["acc_norm"].as_f64().unwrap(), "{what}: acc_norm");
            acc += f64::from(u8::from(s.acc));
            acc_norm += f64::from(u8::from(s.acc_norm));
        }
        let n = samples.len() as f64;
        assert_eq!((score["acc"].as_f64().unwrap(), score["accNorm"].as_f64().unwrap()), (acc / n, acc_norm / n));
        for t in tasks {
            let subject = t.strip_prefix("mmlu_");
            let ours = subject.map_or(&score, |s| &score["subjects"][s]);
            for (metric, theirs_metric) in [("acc", "acc"), ("accNorm", "acc_norm")] {
                assert_eq!(ours[metric].as_f64(), theirs[t][theirs_metric].as_f64(), "{t}: {metric}");
            }
        }
        println!("{}: {} questions, acc {} acc_norm {}", c.name, samples.len(), score["acc"], score["accNorm"]);
    }
    println!("largest log-likelihood difference: {worst:.1e} (relative)");
    std::fs::remove_dir_all(&root).unwrap();
}
