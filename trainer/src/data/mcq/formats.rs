//! Question sets on disk: MedQA, MMLU and ARC, as JSON Lines, a JSON array or
//! Parquet, with any number of options. Each format is the layout its Hugging Face
//! dataset has (and, for ARC, AI2's own jsonl):
//!
//! - MedQA: `{"question", "options": {"A": …, "B": …}, "answer_idx": "B"}`;
//! - MMLU: `{"question", "choices": […], "answer": 1, "subject"}` (`answer` an index or
//!   a letter);
//! - ARC: `{"question", "choices": {"text": […], "label": […]}, "answerKey"}`, or
//!   `{"question": {"stem", "choices": [{"text", "label"}]}, "answerKey"}`.

use std::path::Path;
use std::str::FromStr;

use serde_json::{Map, Value, json};

use super::record::McqRecord;
use crate::{Error, io_err};

/// The layout of a question set's records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum McqFormat {
    /// Told apart by the first record's fields.
    #[default]
    Auto,
    Medqa,
    Mmlu,
    Arc,
}

impl McqFormat {
    pub fn name(self) -> &'static str {
        match self {
            McqFormat::Auto => "auto",
            McqFormat::Medqa => "medqa",
            McqFormat::Mmlu => "mmlu",
            McqFormat::Arc => "arc",
        }
    }

    /// The format a record's fields say it is in.
    fn detect(v: &Value) -> Result<McqFormat, String> {
        let has = |f: &str| v.get(f).is_some();
        if has("options") && has("answer_idx") {
            Ok(McqFormat::Medqa)
        } else if has("answerKey") {
            Ok(McqFormat::Arc)
        } else if has("choices") && has("answer") {
            Ok(McqFormat::Mmlu)
        } else {
            let fields: Vec<&str> = v.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
            Err(format!(
                "not a known question format (fields: {}); expected MedQA (options, answer_idx), MMLU (question, \
                 choices, answer) or ARC (question, choices, answerKey)",
                fields.join(", ")
            ))
        }
    }

    /// One record in this (not `Auto`) format.
    fn parse(self, v: &Value) -> Result<McqRecord, String> {
        match self {
            McqFormat::Medqa => parse_medqa(v),
            McqFormat::Mmlu => parse_mmlu(v),
            McqFormat::Arc => parse_arc(v),
            McqFormat::Auto => McqFormat::detect(v)?.parse(v),
        }
    }
}

impl FromStr for McqFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [McqFormat::Auto, McqFormat::Medqa, McqFormat::Mmlu, McqFormat::Arc]
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("{s:?} is not a question format; expected auto, medqa, mmlu or arc"))
    }
}

impl std::fmt::Display for McqFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A question set read from a file, with the format its records are in (never `Auto`).
#[derive(Clone, Debug, PartialEq)]
pub struct McqSet {
    pub format: McqFormat,
    pub records: Vec<McqRecord>,
}

/// The questions of a `.jsonl`, `.json` (JSON Lines or one array) or `.parquet` file in
/// `format` (`Auto`: the first record's). Errors name the file and the line or row.
pub fn read(path: &Path, format: McqFormat) -> Result<McqSet, Error> {
    let bad = |what: String, message: String| Error::Data {
        name: path.display().to_string(),
        message: format!("{what}: {message}"),
    };
    let (rows, unit) = if path.extension().is_some_and(|e| e == "parquet") {
        (parquet_rows(path)?, "row")
    } else {
        (json_rows(path)?, "line")
    };
    let mut format = format;
    let mut records = Vec::with_capacity(rows.len());
    for (at, v) in rows {
        if format == McqFormat::Auto {
            format = McqFormat::detect(&v).map_err(|m| bad(format!("{unit} {at}"), m))?;
        }
        records.push(format.parse(&v).map_err(|m| bad(format!("{unit} {at} ({format})"), m))?);
    }
    Ok(McqSet { format, records })
}

/// Each record of a JSON Lines file or JSON array, with its line (1-based).
fn json_rows(path: &Path) -> Result<Vec<(usize, Value)>, Error> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let bad = |line: usize, message: String| Error::Data {
        name: path.display().to_string(),
        message: format!("line {line}: {message}"),
    };
    if text.trim_start().starts_with('[') {
        let all: Vec<Value> = serde_json::from_str(&text).map_err(|e| bad(e.line(), format!("not JSON: {e}")))?;
        return Ok(all.into_iter().enumerate().map(|(i, v)| (i + 1, v)).collect());
    }
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map(|v| (i + 1, v)).map_err(|e| bad(i + 1, format!("not JSON: {e}"))))
        .collect()
}

/// Each row of a Parquet file as JSON (lists as arrays, structs as objects), with its
/// number (1-based).
fn parquet_rows(path: &Path) -> Result<Vec<(usize, Value)>, Error> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let bad = |message: String| Error::Data { name: path.display().to_string(), message };
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let reader = SerializedFileReader::new(file).map_err(|e| bad(format!("not a Parquet file: {e}")))?;
    let rows = reader.get_row_iter(None).map_err(|e| bad(e.to_string()))?;
    rows.enumerate()
        .map(|(i, row)| row.map(|r| (i + 1, r.to_json_value())).map_err(|e| bad(format!("row {}: {e}", i + 1))))
        .collect()
}

fn string<'a>(v: &'a Value, field: &str) -> Result<&'a str, String> {
    v.get(field).and_then(Value::as_str).ok_or_else(|| format!("field `{field}` is missing or not a string"))
}

fn strings(v: &Value, field: &str) -> Result<Vec<String>, String> {
    let list =
        v.get(field).and_then(Value::as_array).ok_or_else(|| format!("field `{field}` is missing or not a list"))?;
    list.iter()
        .enumerate()
        .map(|(i, x)| x.as_str().map(str::to_string).ok_or_else(|| format!("`{field}[{i}]` is not a string")))
        .collect()
}

/// Two to [`McqRecord::MAX_OPTIONS`] options, and the answer among them.
fn record(question: &str, options: Vec<String>, answer: usize, field: &str) -> Result<McqRecord, String> {
    if !(2..=McqRecord::MAX_OPTIONS).contains(&options.len()) {
        return Err(format!("{} options; a question needs 2 to {}", options.len(), McqRecord::MAX_OPTIONS));
    }
    if answer >= options.len() {
        return Err(format!("field `{field}` points past the {} options", options.len()));
    }
    Ok(McqRecord::new(question.trim(), options, answer))
}

/// The option index a letter names (`"C"` → 2).
fn letter_index(s: &str) -> Option<usize> {
    let mut chars = s.trim().chars();
    match (chars.next(), chars.next()) {
        (Some(c @ 'A'..='Z'), None) => Some((c as u8 - b'A') as usize),
        _ => None,
    }
}

/// A MedQA record (the GBaker / jind11 jsonl): options keyed `A`, `B`, … in order.
pub fn parse_medqa(v: &Value) -> Result<McqRecord, String> {
    let question = string(v, "question")?;
    let opts = v.get("options").and_then(Value::as_object).ok_or("field `options` is missing or not an object")?;
    let mut options = Vec::new();
    for i in 0..opts.len() {
        let key = McqRecord::letter(i).to_string();
        let text = opts.get(&key).and_then(Value::as_str).ok_or_else(|| {
            let keys: Vec<&str> = opts.keys().map(String::as_str).collect();
            format!(
                "field `options.{key}` is missing or not a string (options are keyed A, B, …; got {})",
                keys.join(", ")
            )
        })?;
        options.push(text.to_string());
    }
    let idx = string(v, "answer_idx")?;
    let answer = letter_index(idx).filter(|&a| a < options.len()).ok_or_else(|| {
        format!(
            "field `answer_idx` is {idx:?}; expected one of the option letters A to {}",
            McqRecord::letter(options.len().max(1) - 1)
        )
    })?;
    record(question, options, answer, "answer_idx")
}

/// An MMLU record (`cais/mmlu`): `answer` is the option's index (or its letter).
fn parse_mmlu(v: &Value) -> Result<McqRecord, String> {
    let question = string(v, "question")?;
    let options = strings(v, "choices")?;
    let answer = match v.get("answer") {
        Some(Value::Number(n)) => n.as_u64().map(|a| a as usize),
        Some(Value::String(s)) => letter_index(s).or_else(|| s.trim().parse().ok()),
        _ => None,
    }
    .ok_or("field `answer` is missing or not an option index (0, 1, …) or letter")?;
    let mut r = record(question, options, answer, "answer")?;
    r.subject = v.get("subject").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
    Ok(r)
}

/// An ARC record: Hugging Face's `allenai/ai2_arc` layout or AI2's own jsonl.
fn parse_arc(v: &Value) -> Result<McqRecord, String> {
    let (question, texts, labels) = match v.get("question") {
        Some(Value::Object(q)) => {
            let stem =
                q.get("stem").and_then(Value::as_str).ok_or("field `question.stem` is missing or not a string")?;
            let choices = q
                .get("choices")
                .and_then(Value::as_array)
                .ok_or("field `question.choices` is missing or not a list")?;
            let field = |c: &Value, f: &str, i: usize| {
                c.get(f)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| format!("field `question.choices[{i}].{f}` is missing or not a string"))
            };
            let texts = choices.iter().enumerate().map(|(i, c)| field(c, "text", i)).collect::<Result<_, _>>()?;
            let labels = choices.iter().enumerate().map(|(i, c)| field(c, "label", i)).collect::<Result<_, _>>()?;
            (stem, texts, labels)
        }
        _ => {
            let question = string(v, "question")?;
            let choices = v.get("choices").cloned().unwrap_or_else(|| Value::Object(Map::new()));
            let texts = strings(&choices, "text").map_err(|m| m.replace("`text", "`choices.text"))?;
            let labels: Vec<String> = strings(&choices, "label").map_err(|m| m.replace("`label", "`choices.label"))?;
            (question, texts, labels)
        }
    };
    if texts.len() != labels.len() {
        return Err(format!("{} choice texts but {} labels", texts.len(), labels.len()));
    }
    let key = string(v, "answerKey")?;
    let answer = labels
        .iter()
        .position(|l| l.trim() == key.trim())
        .ok_or_else(|| format!("field `answerKey` is {key:?}, not one of the labels {}", labels.join(", ")))?;
    record(question, texts, answer, "answerKey")
}

/// The MedQA jsonl form of a record.
pub fn medqa_json(r: &McqRecord) -> Value {
    let options: Map<String, Value> =
        r.options.iter().enumerate().map(|(i, o)| (McqRecord::letter(i).to_string(), json!(o))).collect();
    json!({
        "question": r.question,
        "options": options,
        "answer_idx": McqRecord::letter(r.answer).to_string(),
        "answer": r.options[r.answer],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_format_reads_into_the_same_record() {
        let want = McqRecord::new("Which is a prime?", opts(&["4", "6", "7", "8", "9"]), 2);
        let cases = [
            (
                McqFormat::Medqa,
                json!({"question": "Which is a prime?", "options": {"A": "4", "B": "6", "C": "7", "D": "8", "E": "9"}, "answer_idx": "C"}),
            ),
            (
                McqFormat::Mmlu,
                json!({"question": "Which is a prime?", "choices": ["4", "6", "7", "8", "9"], "answer": 2}),
            ),
            (
                McqFormat::Mmlu,
                json!({"question": "Which is a prime?", "choices": ["4", "6", "7", "8", "9"], "answer": "C"}),
            ),
            (
                McqFormat::Arc,
                json!({"question": "Which is a prime?", "choices": {"text": ["4", "6", "7", "8", "9"], "label": ["1", "2", "3", "4", "5"]}, "answerKey": "3"}),
            ),
            (
                McqFormat::Arc,
                json!({"question": {"stem": "Which is a prime?", "choices": [
                    {"text": "4", "label": "A"}, {"text": "6", "label": "B"}, {"text": "7", "label": "C"},
                    {"text": "8", "label": "D"}, {"text": "9", "label": "E"}]}, "answerKey": "C"}),
            ),
        ];
        for (format, v) in cases {
            assert_eq!(McqFormat::detect(&v), Ok(format), "{v}");
            assert_eq!(format.parse(&v).as_ref(), Ok(&want), "{v}");
        }
        assert_eq!(parse_medqa(&medqa_json(&want)), Ok(want));
    }

    #[test]
    fn bad_records_name_the_field() {
        let cases = [
            (
                McqFormat::Medqa,
                json!({"question": "q", "options": {"A": "x", "C": "y"}, "answer_idx": "A"}),
                "`options.B`",
            ),
            (McqFormat::Medqa, json!({"question": "q", "options": {"A": "x", "B": "y"}, "answer_idx": "C"}), "A to B"),
            (McqFormat::Mmlu, json!({"question": "q", "choices": ["x", "y"], "answer": 2}), "`answer` points past"),
            (McqFormat::Mmlu, json!({"question": "q", "choices": ["x"], "answer": 0}), "1 options"),
            (McqFormat::Mmlu, json!({"question": "q", "choices": "x", "answer": 0}), "`choices`"),
            (
                McqFormat::Arc,
                json!({"question": "q", "choices": {"text": ["x", "y"], "label": ["A", "B"]}, "answerKey": "E"}),
                "A, B",
            ),
            (
                McqFormat::Arc,
                json!({"question": "q", "choices": {"text": ["x", "y"]}, "answerKey": "A"}),
                "`choices.label`",
            ),
            (McqFormat::Auto, json!({"prompt": "q"}), "fields: prompt"),
        ];
        for (format, v, want) in cases {
            let err = format.parse(&v).unwrap_err();
            assert!(err.contains(want), "{v}: {err}");
        }
        assert_eq!("mmlu".parse(), Ok(McqFormat::Mmlu));
        assert!("hellaswag".parse::<McqFormat>().unwrap_err().contains("auto, medqa, mmlu or arc"));
    }

    #[test]
    fn files_are_read_as_json_lines_arrays_or_parquet() {
        let dir = std::env::temp_dir().join(format!("mcq-formats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let line = r#"{"question": "q", "choices": ["x", "y", "z"], "answer": 1, "subject": "anatomy"}"#;
        let jsonl = dir.join("a.jsonl");
        std::fs::write(&jsonl, format!("{line}\n\n{line}\n")).unwrap();
        let set = read(&jsonl, McqFormat::Auto).unwrap();
        assert_eq!((set.format, set.records.len()), (McqFormat::Mmlu, 2));
        assert_eq!(set.records[0].subject.as_deref(), Some("anatomy"));
        let array = dir.join("a.json");
        std::fs::write(&array, format!("[{line}, {line}, {line}]")).unwrap();
        assert_eq!(read(&array, McqFormat::Mmlu).unwrap().records.len(), 3);
        std::fs::write(&jsonl, format!("{line}\n{{\"question\": \"q\", \"choices\": [\"x\"], \"answer\": 0}}\n"))
            .unwrap();
        let err = read(&jsonl, McqFormat::Auto).unwrap_err().to_string();
        assert!(err.contains("a.jsonl") && err.contains("line 2 (mmlu)") && err.contains("1 options"), "{err}");
        std::fs::write(&jsonl, format!("{line}\nnot json\n")).unwrap();
        assert!(read(&jsonl, McqFormat::Auto).unwrap_err().to_string().contains("line 2: not JSON"));
        std::fs::write(&jsonl, format!("{line}\n")).unwrap();
        let err = read(&jsonl, McqFormat::Arc).unwrap_err().to_string();
        assert!(err.contains("line 1 (arc)") && err.contains("`choices.text`"), "{err}");

        // Parquet as Hugging Face writes MMLU: `choices` a list column.
        let parquet = dir.join("test-00000-of-00001.parquet");
        let questions = [("q0", vec!["x", "y", "z"], 1, "anatomy"), ("q1", vec!["u", "v", "w", "t"], 3, "virology")];
        write_mmlu_parquet(&parquet, &questions);
        let set = read(&parquet, McqFormat::Auto).unwrap();
        assert_eq!(set.format, McqFormat::Mmlu);
        let want: Vec<McqRecord> = questions
            .iter()
            .map(|(q, o, a, s)| McqRecord { subject: Some(s.to_string()), ..McqRecord::new(*q, opts(o), *a as usize) })
            .collect();
        assert_eq!(set.records, want);
        let err = read(&parquet, McqFormat::Medqa).unwrap_err().to_string();
        assert!(err.contains("row 1 (medqa)") && err.contains("`options`"), "{err}");
        std::fs::write(&parquet, "not parquet").unwrap();
        assert!(read(&parquet, McqFormat::Auto).unwrap_err().to_string().contains("not a Parquet file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn write_mmlu_parquet(path: &Path, rows: &[(&str, Vec<&str>, i64, &str)]) {
        use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
        use parquet::file::properties::WriterProperties;
        use parquet::file::writer::SerializedFileWriter;
        let schema = parquet::schema::parser::parse_message_type(
            "message schema { REQUIRED BYTE_ARRAY question (UTF8); REQUIRED BYTE_ARRAY subject (UTF8); \
             REQUIRED group choices (LIST) { REPEATED group list { REQUIRED BYTE_ARRAY element (UTF8); } } \
             REQUIRED INT64 answer; }",
        )
        .unwrap();
        let props = std::sync::Arc::new(WriterProperties::builder().build());
        let file = std::fs::File::create(path).unwrap();
        let mut w = SerializedFileWriter::new(file, std::sync::Arc::new(schema), props).unwrap();
        let mut rg = w.next_row_group().unwrap();
        let strings = |xs: Vec<&str>| xs.into_iter().map(ByteArray::from).collect::<Vec<_>>();
        for column in ["question", "subject"] {
            let mut col = rg.next_column().unwrap().unwrap();
            let values = strings(rows.iter().map(|r| if column == "question" { r.0 } else { r.3 }).collect());
            col.typed::<ByteArrayType>().write_batch(&values, None, None).unwrap();
            col.close().unwrap();
        }
        // A list's elements: definition level 1 each; repetition 0 opens a row's list.
        let mut col = rg.next_column().unwrap().unwrap();
        let values = strings(rows.iter().flat_map(|r| r.1.clone()).collect());
        let defs = vec![1i16; values.len()];
        let reps: Vec<i16> = rows.iter().flat_map(|r| (0..r.1.len()).map(|i| i16::from(i > 0))).collect();
        col.typed::<ByteArrayType>().write_batch(&values, Some(&defs), Some(&reps)).unwrap();
        col.close().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<Int64Type>().write_batch(&rows.iter().map(|r| r.2).collect::<Vec<_>>(), None, None).unwrap();
        col.close().unwrap();
        rg.close().unwrap();
        w.close().unwrap();
    }
}
