//! How each question format is put to a model, as lm-evaluation-harness's task files
//! for it do: the text of a question (`doc_to_text`), the continuations scored
//! (`doc_to_choice`, after the target delimiter `" "`), the description before the
//! examples, and few-shot examples separated by a blank line.
//!
//! - MedQA (`medqa_4options`): `Question: …\nA. …\nB. …\nAnswer:`, scoring the letters.
//! - MMLU (`mmlu`): `The following are multiple choice questions (with answers) about
//!   <subject>.\n\n` then `<question>\nA. …\nAnswer:`, scoring the letters.
//! - ARC (`arc_easy`, `arc_challenge`): `Question: …\nAnswer:`, scoring the option texts.

use crate::data::mcq::{McqFormat, McqRecord};

/// Between a question's text and its answer.
pub const TARGET_DELIMITER: &str = " ";
/// Between few-shot examples, and before the question.
pub const FEWSHOT_DELIMITER: &str = "\n\n";

/// The question as the format's task shows it, up to `Answer:`.
pub fn question_text(format: McqFormat, r: &McqRecord) -> String {
    match format {
        McqFormat::Mmlu => format!("{}\n{}Answer:", r.question.trim(), r.lettered_options()),
        McqFormat::Arc => format!("Question: {}\nAnswer:", r.question),
        McqFormat::Medqa | McqFormat::Auto => r.prompt(),
    }
}

/// The continuations scored, in option order (without the target delimiter): the
/// option letters, or for ARC the option texts.
pub fn choices(format: McqFormat, r: &McqRecord) -> Vec<String> {
    match format {
        McqFormat::Arc => r.options.clone(),
        _ => (0..r.options.len()).map(|i| McqRecord::letter(i).to_string()).collect(),
    }
}

/// What opens the context: MMLU names the subject.
fn description(format: McqFormat, r: &McqRecord) -> String {
    match (format, &r.subject) {
        (McqFormat::Mmlu, Some(s)) => {
            format!("The following are multiple choice questions (with answers) about {}.\n\n", s.replace('_', " "))
        }
        (McqFormat::Mmlu, None) => "The following are multiple choice questions (with answers).\n\n".into(),
        _ => String::new(),
    }
}

/// The whole context before a continuation: the description, each example with its
/// answer, and the question.
pub fn context(format: McqFormat, r: &McqRecord, shots: &[&McqRecord]) -> String {
    let mut text = description(format, r);
    for s in shots {
        let answer = &choices(format, s)[s.answer];
        text += &format!("{}{TARGET_DELIMITER}{answer}{FEWSHOT_DELIMITER}", question_text(format, s));
    }
    text + &question_text(format, r)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A three-option question (gold `5`).
    pub(in crate::eval) fn q(question: &str, subject: Option<&str>) -> McqRecord {
        McqRecord {
            subject: subject.map(str::to_string),
            ..McqRecord::new(question, vec!["4".into(), "5".into(), "six".into()], 1)
        }
    }

    #[test]
    fn each_format_asks_as_its_lm_eval_task_does() {
        let r = q(" What is 2 + 3? ", Some("elementary_mathematics"));
        let shot = q("What is 1 + 4?", None);
        assert_eq!(
            context(McqFormat::Mmlu, &r, &[&shot]),
            "The following are multiple choice questions (with answers) about elementary mathematics.\n\n\
             What is 1 + 4?\nA. 4\nB. 5\nC. six\nAnswer: B\n\n\
             What is 2 + 3?\nA. 4\nB. 5\nC. six\nAnswer:"
        );
        assert_eq!(choices(McqFormat::Mmlu, &r), ["A", "B", "C"]);
        assert_eq!(
            context(McqFormat::Arc, &shot, &[&shot]),
            "Question: What is 1 + 4?\nAnswer: 5\n\nQuestion: What is 1 + 4?\nAnswer:"
        );
        assert_eq!(choices(McqFormat::Arc, &r), ["4", "5", "six"]);
        assert_eq!(context(McqFormat::Medqa, &shot, &[]), "Question: What is 1 + 4?\nA. 4\nB. 5\nC. six\nAnswer:");
    }
}
