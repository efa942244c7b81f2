//! The multiple-choice record.

use crate::data::split::{Split, split_of};

/// A multiple-choice question with its gold answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McqRecord {
    /// The question, without the `Question: ` prefix.
    pub question: String,
    /// The options in order: A, B, … (two or more).
    pub options: Vec<String>,
    /// Index of the correct option (0 = A).
    pub answer: usize,
    /// The subject the question set files it under (MMLU's `subject`).
    pub subject: Option<String>,
}

impl McqRecord {
    /// The most options a question may have: A to Z.
    pub const MAX_OPTIONS: usize = 26;

    /// A question without a subject.
    pub fn new(question: impl Into<String>, options: Vec<String>, answer: usize) -> McqRecord {
        McqRecord { question: question.into(), options, answer, subject: None }
    }

    /// The letter of option `i` (0 → 'A').
    pub fn letter(i: usize) -> char {
        (b'A' + i as u8) as char
    }

    /// The text up to and including `Answer:`, which a policy completes with a letter:
    /// the question and its lettered options.
    pub fn prompt(&self) -> String {
        format!("Question: {}\n{}Answer:", self.question, self.lettered_options())
    }

    /// `A. first\nB. second\n…`, one line an option.
    pub fn lettered_options(&self) -> String {
        self.options.iter().enumerate().map(|(i, o)| format!("{}. {o}\n", Self::letter(i))).collect()
    }

    /// The split this question belongs to, by a hash of the question and its answer.
    pub fn split(&self) -> Split {
        split_of(&format!("{}\n{}", self.question, self.options[self.answer]))
    }

    /// The full document: the prompt, a space and the gold letter.
    pub fn text(&self) -> String {
        format!("{} {}", self.prompt(), Self::letter(self.answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_letters_every_option() {
        let r = McqRecord::new("Which?", ["x", "y", "z", "w", "v"].map(String::from).to_vec(), 4);
        assert_eq!(r.prompt(), "Question: Which?\nA. x\nB. y\nC. z\nD. w\nE. v\nAnswer:");
        assert_eq!(r.text(), "Question: Which?\nA. x\nB. y\nC. z\nD. w\nE. v\nAnswer: E");
    }
}
