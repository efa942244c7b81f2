//! Accuracy on a question set, from each question's outcome, as lm-evaluation-harness
//! aggregates it: the mean of 0/1 scores and its standard error.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How one question went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The gold continuation has the highest summed log-likelihood.
    pub acc: bool,
    /// … the highest per character.
    pub acc_norm: bool,
    /// The greedily generated answer names the gold letter.
    pub greedy: bool,
    /// The greedily generated answer names no letter.
    pub unparsed: bool,
}

impl Outcome {
    /// The outcome as four numbers, the layout the ranks sum.
    pub const FIELDS: usize = 4;

    pub fn to_array(self) -> [f64; Self::FIELDS] {
        [self.acc, self.acc_norm, self.greedy, self.unparsed].map(|b| f64::from(u8::from(b)))
    }

    pub fn from_array(v: &[f64]) -> Outcome {
        Outcome { acc: v[0] > 0.5, acc_norm: v[1] > 0.5, greedy: v[2] > 0.5, unparsed: v[3] > 0.5 }
    }
}

/// Accuracy on a set of questions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Accuracy {
    pub questions: u64,
    /// lm-eval's `acc`: the fraction whose gold continuation has the highest
    /// log-likelihood.
    pub acc: f64,
    pub acc_stderr: f64,
    /// lm-eval's `acc_norm`: the same with each log-likelihood divided by the
    /// continuation's length in characters.
    pub acc_norm: f64,
    pub acc_norm_stderr: f64,
    /// The fraction whose greedily generated answer letter is the gold one.
    pub greedy: f64,
    /// The fraction whose greedy answer names no option letter.
    pub unparsed: f64,
}

impl Accuracy {
    pub fn of(outcomes: &[Outcome]) -> Accuracy {
        let n = outcomes.len();
        let mean = |f: fn(&Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count() as f64 / n.max(1) as f64;
        let (acc, acc_norm) = (mean(|o| o.acc), mean(|o| o.acc_norm));
        Accuracy {
            questions: n as u64,
            acc,
            acc_stderr: stderr(acc, n),
            acc_norm,
            acc_norm_stderr: stderr(acc_norm, n),
            greedy: mean(|o| o.greedy),
            unparsed: mean(|o| o.unparsed),
        }
    }
}

/// The standard error of a mean of `n` 0/1 scores with mean `p`: the sample standard
/// deviation over √n, as lm-eval's `mean_stderr`.
fn stderr(p: f64, n: usize) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let n = n as f64;
    (p * (1.0 - p) * n / (n - 1.0) / n).sqrt()
}

/// A question set's score: over every question, and per subject where the set has
/// subjects (MMLU).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McqScore {
    #[serde(flatten)]
    pub all: Accuracy,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub subjects: BTreeMap<String, Accuracy>,
}

impl McqScore {
    /// From each question's outcome and subject.
    pub fn of(outcomes: &[(Outcome, Option<&str>)]) -> McqScore {
        let mut by_subject: BTreeMap<String, Vec<Outcome>> = BTreeMap::new();
        for (o, s) in outcomes {
            if let Some(s) = s {
                by_subject.entry(s.to_string()).or_default().push(*o);
            }
        }
        let all: Vec<Outcome> = outcomes.iter().map(|(o, _)| *o).collect();
        McqScore {
            all: Accuracy::of(&all),
            subjects: by_subject.into_iter().map(|(s, o)| (s, Accuracy::of(&o))).collect(),
        }
    }

    /// A table: a row per subject, then the whole set.
    pub fn table(&self, name: &str) -> String {
        let width = self.subjects.keys().map(String::len).chain([name.len(), 7]).max().unwrap_or(7);
        let row = |what: &str, a: &Accuracy| {
            format!(
                "{what:<width$}  {:>9}  {:>6.2}% ± {:<5.2}  {:>6.2}% ± {:<5.2}  {:>6.2}%  {:>8.2}%\n",
                a.questions,
                100.0 * a.acc,
                100.0 * a.acc_stderr,
                100.0 * a.acc_norm,
                100.0 * a.acc_norm_stderr,
                100.0 * a.greedy,
                100.0 * a.unparsed,
            )
        };
        let mut out = format!(
            "{:<width$}  {:>9}  {:^15}  {:^15}  {:>7}  {:>9}\n",
            "set", "questions", "acc", "acc_norm", "greedy", "no answer"
        );
        for (s, a) in &self.subjects {
            out += &row(s, a);
        }
        out + &row(name, &self.all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accuracy_is_the_mean_with_lm_evals_standard_error() {
        let o = |acc, acc_norm| Outcome { acc, acc_norm, greedy: acc, unparsed: false };
        let outcomes = [o(true, true), o(false, true), o(false, false), o(true, true)];
        let a = Accuracy::of(&outcomes);
        assert_eq!((a.questions, a.acc, a.acc_norm, a.greedy), (4, 0.5, 0.75, 0.5));
        // numpy: np.std([1, 0, 0, 1], ddof=1) / 2 = 0.288675…
        assert!((a.acc_stderr - 0.288_675_134_594_812_9).abs() < 1e-12, "{}", a.acc_stderr);
        assert!((a.acc_norm_stderr - 0.25).abs() < 1e-12, "{}", a.acc_norm_stderr);
        assert_eq!(Accuracy::of(&[]).questions, 0);
    }

    #[test]
    fn subjects_are_scored_apart_and_together() {
        let yes = Outcome { acc: true, ..Outcome::default() };
        let no = Outcome::default();
        let s = McqScore::of(&[(yes, Some("anatomy")), (no, Some("anatomy")), (yes, Some("virology")), (yes, None)]);
        assert_eq!(s.all.acc, 0.75);
        assert_eq!(s.subjects["anatomy"].acc, 0.5);
        assert_eq!(s.subjects["virology"].acc, 1.0);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["acc"], 0.75);
        assert_eq!(json["subjects"]["anatomy"]["questions"], 2);
        let table = s.table("mmlu.jsonl");
        assert!(table.lines().nth(1).unwrap().starts_with("anatomy"), "{table}");
        assert!(table.lines().last().unwrap().contains("75.00%"), "{table}");
        for o in [yes, no, Outcome { acc_norm: true, unparsed: true, ..no }] {
            assert_eq!(Outcome::from_array(&o.to_array()), o);
        }
    }
}
