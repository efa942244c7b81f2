//! The multiple-choice reward: the answer letter a completion commits to
//! ([`parse_answer`]), scored. Plain functions, so another task's reward replaces them
//! in one place.

use crate::eval::parse_answer;

/// A scored completion.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    pub reward: f64,
    pub correct: bool,
    /// No answer letter could be parsed.
    pub unparsed: bool,
}

/// 1 for the gold letter, 0 otherwise, minus `length_penalty` per completion token. A
/// completion with no answer letter is charged as if it were one token longer than the
/// longest allowed (`max_tokens`), so that stopping early without answering never scores
/// above a wrong answer: with a length penalty, an empty completion would otherwise beat
/// every wrong letter, and a group with no right answer would teach the policy to stop.
pub fn mcq_reward(
    completion: &str,
    gold: usize,
    options: usize,
    completion_tokens: usize,
    length_penalty: f64,
    max_tokens: usize,
) -> Scored {
    let answer = parse_answer(completion, options);
    let correct = answer == Some(gold);
    let charged = if answer.is_some() { completion_tokens } else { max_tokens + 1 };
    Scored {
        reward: if correct { 1.0 } else { 0.0 } - length_penalty * charged as f64,
        correct,
        unparsed: answer.is_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_is_correctness_minus_the_length_penalty() {
        assert_eq!(mcq_reward(" B", 1, 4, 2, 0.01, 16), Scored { reward: 0.98, correct: true, unparsed: false });
        assert_eq!(mcq_reward(" A", 1, 4, 2, 0.01, 16), Scored { reward: -0.02, correct: false, unparsed: false });
        let none = mcq_reward(" maybe", 1, 4, 10, 0.01, 16);
        assert!(none.unparsed && !none.correct && (none.reward + 0.17).abs() < 1e-12);
        assert_eq!(mcq_reward(" B", 1, 4, 2, 0.0, 16).reward, 1.0);
    }

    /// No answer scores below every answer, however short: an empty completion (EOS at
    /// once) does not beat a wrong letter, nor does a wrong answer that ran to the limit.
    #[test]
    fn no_answer_never_beats_a_wrong_answer() {
        let empty = mcq_reward("", 1, 4, 0, 0.01, 16);
        assert!(empty.unparsed);
        for tokens in 1..=16 {
            assert!(empty.reward < mcq_reward(" A", 1, 4, tokens, 0.01, 16).reward, "{tokens} tokens");
        }
    }
}
