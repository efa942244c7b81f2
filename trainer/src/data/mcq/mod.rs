//! Multiple-choice questions: the record every question set becomes (the embedded
//! generators, MedQA, MMLU and ARC files), and the readers of those files
//! ([`formats`]).

mod formats;
mod record;

pub use formats::{McqFormat, McqSet, medqa_json, parse_medqa, read};
pub use record::McqRecord;
