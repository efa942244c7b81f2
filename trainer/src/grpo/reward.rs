//! The multiple-choice reward: parse the answer letter a completion commits to, and
//! score it. Plain functions, so another task's reward replaces them in one place.

/// The option index (0 = A … 3 = D) a completion answers, or `None` when it gives no
/// answer or hedges between several letters.
///
/// Accepted: a letter at the start (`" C"`, `"C."`, `"(c)"`, `"C) Aspirin"`), or an
/// explicit `answer: C`, `answer is (c)` or `(C)` anywhere. A bare lowercase letter
/// counts only as the whole answer (`" c"`), never before other words (`a` is an article). Two different letters at the
/// start (`"A or C"`) or in explicit forms are no answer.
pub fn parse_answer(completion: &str) -> Option<usize> {
    let letter =
        |c: char| matches!(c.to_ascii_uppercase(), 'A'..='D').then(|| (c.to_ascii_uppercase() as u8 - b'A') as usize);
    let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_alphanumeric());
    let first_line = completion.trim_start().lines().next().unwrap_or("");
    // A letter opening the completion, bare or in parentheses.
    let mut chars = first_line.chars().peekable();
    let paren = chars.next_if_eq(&'(').is_some();
    let lead = chars.next().and_then(|c| {
        let rest: String = chars.clone().collect();
        let ok = if paren {
            rest.starts_with(')')
        } else if c.is_ascii_uppercase() {
            boundary(rest.chars().next())
        } else {
            // A lowercase letter only when it is the whole answer: " c", "c."
            rest.trim_matches(|r: char| r.is_whitespace() || matches!(r, '.' | ')' | ':')).is_empty()
        };
        if ok { letter(c) } else { None }
    });
    if let Some(a) = lead {
        // "A or C", "B, C": a second standalone capital option letter on the same line hedges.
        let rest: String = chars.collect();
        let hedged = standalone_capitals(&rest).any(|b| b != a);
        return (!hedged).then_some(a);
    }
    let mut found: Vec<usize> = explicit(completion).collect();
    found.sort_unstable();
    found.dedup();
    if found.len() == 1 { Some(found[0]) } else { None }
}

/// Standalone capital A–D in `s` (not inside a word).
fn standalone_capitals(s: &str) -> impl Iterator<Item = usize> + '_ {
    let chars: Vec<char> = s.chars().collect();
    (0..chars.len()).filter_map(move |i| {
        let c = chars[i];
        let alone =
            (i == 0 || !chars[i - 1].is_alphanumeric()) && chars.get(i + 1).is_none_or(|n| !n.is_alphanumeric());
        (alone && matches!(c, 'A'..='D')).then(|| (c as u8 - b'A') as usize)
    })
}

/// Letters given as `answer: X`, `answer is X`, `answer is (X)` or `(X)`, any case.
fn explicit(s: &str) -> impl Iterator<Item = usize> + '_ {
    let lower = s.to_ascii_lowercase();
    let bytes = lower.into_bytes();
    let n = bytes.len();
    let option = |b: u8| (b'a'..=b'd').contains(&b).then(|| (b - b'a') as usize);
    let word_end = move |bytes: &[u8], i: usize| i >= n || !bytes[i].is_ascii_alphanumeric();
    let mut out = Vec::new();
    for i in 0..n {
        // "(x)" with a word boundary before it.
        if bytes[i] == b'('
            && i + 2 < n
            && bytes[i + 2] == b')'
            && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric())
            && let Some(o) = option(bytes[i + 1])
        {
            out.push(o);
        }
        if bytes[i..].starts_with(b"answer") {
            let mut j = i + 6;
            let skip = |j: &mut usize, bytes: &[u8]| {
                while *j < n && bytes[*j] == b' ' {
                    *j += 1;
                }
            };
            skip(&mut j, &bytes);
            if j < n && bytes[j] == b':' {
                j += 1;
            } else if bytes[j..].starts_with(b"is") {
                j += 2;
            } else {
                continue;
            }
            skip(&mut j, &bytes);
            let paren = j < n && bytes[j] == b'(';
            if paren {
                j += 1;
            }
            if j < n
                && let Some(o) = option(bytes[j])
                && (if paren { j + 1 < n && bytes[j + 1] == b')' } else { word_end(&bytes, j + 1) })
            {
                out.push(o);
            }
        }
    }
    out.into_iter()
}

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
    completion_tokens: usize,
    length_penalty: f64,
    max_tokens: usize,
) -> Scored {
    let answer = parse_answer(completion);
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
    fn answer_letters_are_parsed_from_the_usual_forms() {
        let cases: &[(&str, Option<usize>)] = &[
            (" C", Some(2)),
            ("C", Some(2)),
            (" C.", Some(2)),
            (" C<|endoftext|>", Some(2)),
            (" C. Aspirin inhibits cyclooxygenase", Some(2)),
            ("(C)", Some(2)),
            (" (c)", Some(2)),
            ("C) Aspirin", Some(2)),
            ("Answer: C", Some(2)),
            ("answer: c", Some(2)),
            ("The answer is B because of the rash.", Some(1)),
            ("the answer is (d)", Some(3)),
            ("I think (A) fits best", Some(0)),
            (" D\nA longer explanation follows.", Some(3)),
            (" c", Some(2)),
            ("b.", Some(1)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_answer(text), *want, "{text:?}");
        }
    }

    #[test]
    fn hedges_words_and_silence_are_no_answer() {
        let cases: &[&str] = &[
            "",
            "   ",
            " a fever and a rash", // the article
            " A or C",             // two letters
            " B, C",
            "(A) or (B)",
            "Answer: A. No, answer: B",
            " Aspirin",                    // a word starting with an option letter
            " E",                          // not an option
            " Because the patient is old", // no letter at all
            "(E)",
        ];
        for text in cases {
            assert_eq!(parse_answer(text), None, "{text:?}");
        }
    }

    #[test]
    fn reward_is_correctness_minus_the_length_penalty() {
        assert_eq!(mcq_reward(" B", 1, 2, 0.01, 16), Scored { reward: 0.98, correct: true, unparsed: false });
        assert_eq!(mcq_reward(" A", 1, 2, 0.01, 16), Scored { reward: -0.02, correct: false, unparsed: false });
        let none = mcq_reward(" maybe", 1, 10, 0.01, 16);
        assert!(none.unparsed && !none.correct && (none.reward + 0.17).abs() < 1e-12);
        assert_eq!(mcq_reward(" B", 1, 2, 0.0, 16).reward, 1.0);
    }

    /// No answer scores below every answer, however short: an empty completion (EOS at
    /// once) does not beat a wrong letter, nor does a wrong answer that ran to the limit.
    #[test]
    fn no_answer_never_beats_a_wrong_answer() {
        let empty = mcq_reward("", 1, 0, 0.01, 16);
        assert!(empty.unparsed);
        for tokens in 1..=16 {
            assert!(empty.reward < mcq_reward(" A", 1, tokens, 0.01, 16).reward, "{tokens} tokens");
        }
    }
}
