//! The option letter a generated answer commits to.

/// The option index (0 = A, 1 = B, …) a completion answers among `options` options,
/// or `None` when it gives no answer or hedges between several letters.
///
/// Accepted: a letter at the start (`" C"`, `"C."`, `"(c)"`, `"C) Aspirin"`), or an
/// explicit `answer: C`, `answer is (c)` or `(C)` anywhere. A bare lowercase letter
/// counts only as the whole answer (`" c"`), never before other words (`a` is an article). Two different letters at the
/// start (`"A or C"`) or in explicit forms are no answer.
pub fn parse_answer(completion: &str, options: usize) -> Option<usize> {
    let last = (b'A' + options.clamp(1, 26) as u8 - 1) as char;
    let letter = |c: char| {
        let c = c.to_ascii_uppercase();
        (c.is_ascii_uppercase() && c <= last).then(|| (c as u8 - b'A') as usize)
    };
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
        let hedged = standalone_capitals(&rest, last).any(|b| b != a);
        return (!hedged).then_some(a);
    }
    let mut found: Vec<usize> = explicit(completion, last).collect();
    found.sort_unstable();
    found.dedup();
    if found.len() == 1 { Some(found[0]) } else { None }
}

/// Standalone capitals A to `last` in `s` (not inside a word).
fn standalone_capitals(s: &str, last: char) -> impl Iterator<Item = usize> + '_ {
    let chars: Vec<char> = s.chars().collect();
    (0..chars.len()).filter_map(move |i| {
        let c = chars[i];
        let alone =
            (i == 0 || !chars[i - 1].is_alphanumeric()) && chars.get(i + 1).is_none_or(|n| !n.is_alphanumeric());
        (alone && ('A'..=last).contains(&c)).then(|| (c as u8 - b'A') as usize)
    })
}

/// Letters given as `answer: X`, `answer is X`, `answer is (X)` or `(X)`, any case.
fn explicit(s: &str, last: char) -> impl Iterator<Item = usize> + '_ {
    let lower = s.to_ascii_lowercase();
    let bytes = lower.into_bytes();
    let n = bytes.len();
    let last = last.to_ascii_lowercase() as u8;
    let option = move |b: u8| (b'a'..=last).contains(&b).then(|| (b - b'a') as usize);
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
            assert_eq!(parse_answer(text, 4), *want, "{text:?}");
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
            assert_eq!(parse_answer(text, 4), None, "{text:?}");
        }
    }

    #[test]
    fn the_letters_run_to_the_last_option() {
        assert_eq!(parse_answer(" E", 5), Some(4));
        assert_eq!(parse_answer("the answer is (e)", 5), Some(4));
        assert_eq!(parse_answer(" E", 4), None);
        assert_eq!(parse_answer(" C", 2), None);
        assert_eq!(parse_answer(" B or E", 5), None);
    }
}
