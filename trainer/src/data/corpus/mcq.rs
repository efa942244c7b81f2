//! Multiple-choice questions about the facts world, and rule questions that name
//! their answer's position: four options each.

use super::facts::{COLORS, N_COUNTRIES, N_ELEMENTS, N_PEOPLE, N_TOWNS, PRODUCTS, PROFESSIONS, World};
use super::rng::{Rng, article, capitalize};
use super::textbook::{CAUSES, CONCEPTS, Concept};
use crate::data::mcq::McqRecord;
use crate::data::split::{Split, split_of};

/// A rule question: it names its answer's position ("Which option comes after B?"),
/// so a small model learns it from reward alone, without the world's facts.
pub(super) fn rule_candidate(rng: &mut Rng) -> (String, String, Vec<String>, Option<usize>) {
    let kind = rng.below(3);
    let at = match kind {
        0 => rng.below(3) + 1,
        1 => rng.below(3),
        _ => rng.below(4),
    };
    let words: Vec<String> = PROFESSIONS.iter().chain(PRODUCTS).map(|s| s.to_string()).collect();
    let gold = rng.pick(&words).clone();
    let question = match kind {
        0 => format!("Which option comes after {}?", McqRecord::letter(at - 1)),
        1 => format!("Which option comes before {}?", McqRecord::letter(at + 1)),
        _ => format!("Which option is {}?", McqRecord::letter(at)),
    };
    let wrong = words.into_iter().filter(|x| *x != gold).collect();
    (question, gold, wrong, Some(at))
}

/// A question with its gold answer, a pool of wrong answers (at least three, distinct)
/// and, for a question that names its answer's position, that position.
pub(super) fn mcq_candidate(rng: &mut Rng, w: &World) -> (String, String, Vec<String>, Option<usize>) {
    let pool = |xs: Vec<String>, gold: &str| xs.into_iter().filter(|x| x != gold).collect::<Vec<_>>();
    let (question, gold, wrong) = match rng.below(14) {
        10..=12 => return rule_candidate(rng),
        13 => {
            let gold = rng.pick(COLORS).to_string();
            let words = PROFESSIONS.iter().chain(PRODUCTS).map(|s| s.to_string()).collect();
            (String::from("Which of these is a color?"), gold, words)
        }
        0 => {
            let c = &w.countries[rng.below(N_COUNTRIES)];
            let gold = w.towns[c.capital].name.clone();
            let wrong = pool(w.towns.iter().map(|t| t.name.clone()).collect(), &gold);
            (format!("What is the capital of {}?", c.name), gold, wrong)
        }
        1 => {
            let t = &w.towns[rng.below(N_TOWNS)];
            let gold = w.countries[t.country].name.clone();
            let wrong = pool(w.countries.iter().map(|c| c.name.clone()).collect(), &gold);
            (format!("In which country is the town of {}?", t.name), gold, wrong)
        }
        2 => {
            let t = &w.towns[rng.below(N_TOWNS)];
            let gold = t.founded.to_string();
            let wrong = pool(w.towns.iter().map(|t| t.founded.to_string()).collect(), &gold);
            (format!("In which year was {} founded?", t.name), gold, wrong)
        }
        3 => {
            let p = &w.people[rng.below(N_PEOPLE)];
            let gold = PROFESSIONS[p.profession].to_string();
            let wrong = pool(PROFESSIONS.iter().map(|s| s.to_string()).collect(), &gold);
            (format!("What does {} work as?", p.name), gold, wrong)
        }
        4 => {
            let p = &w.people[rng.below(N_PEOPLE)];
            let gold = w.towns[p.town].name.clone();
            let wrong = pool(w.towns.iter().map(|t| t.name.clone()).collect(), &gold);
            (format!("Where does {} live?", p.name), gold, wrong)
        }
        5 => {
            let e = &w.elements[rng.below(N_ELEMENTS)];
            let gold = COLORS[e.color].to_string();
            let wrong = pool(COLORS.iter().map(|s| s.to_string()).collect(), &gold);
            (format!("What is the color of {}?", e.name), gold, wrong)
        }
        6 | 7 => {
            let (q, gold) = match rng.below(3) {
                0 => {
                    let (a, b) = (rng.range(0, 99), rng.range(0, 99));
                    (format!("What is {a} + {b}?"), a + b)
                }
                1 => {
                    let (a, b) = (rng.range(0, 99), rng.range(0, 99));
                    let (a, b) = (a.max(b), a.min(b));
                    (format!("What is {a} - {b}?"), a - b)
                }
                _ => {
                    let (a, b) = (rng.range(2, 12), rng.range(2, 12));
                    (format!("What is {a} * {b}?"), a * b)
                }
            };
            let wrong = [1, 2, 10, 11, 9]
                .iter()
                .flat_map(|d| [gold + d, gold.wrapping_sub(*d)])
                .filter(|x| *x <= 300)
                .map(|x| x.to_string())
                .collect();
            (q, gold.to_string(), wrong)
        }
        8 => {
            let (cond, eff) = rng.pick(CAUSES);
            let gold = eff.to_string();
            let wrong = pool(CAUSES.iter().map(|(_, e)| e.to_string()).collect(), &gold);
            (format!("What happens when {cond}?"), gold, wrong)
        }
        _ => {
            let with_examples: Vec<&Concept> = CONCEPTS.iter().filter(|k| !k.examples.is_empty()).collect();
            let k = rng.pick(&with_examples);
            let gold = rng.pick(k.examples).to_string();
            let wrong = CONCEPTS
                .iter()
                .filter(|o| o.name != k.name)
                .flat_map(|o| o.examples.iter().map(|e| e.to_string()))
                .filter(|e| !k.examples.contains(&e.as_str()))
                .collect();
            (format!("Which of these is {} {}?", article(k.name), k.name), capitalize(&gold), wrong)
        }
    };
    (question, gold, wrong, None)
}

pub(super) fn mcq_record(rng: &mut Rng, w: &World, split: Split, rules_only: bool) -> McqRecord {
    loop {
        let (question, gold, mut wrong, at) = if rules_only { rule_candidate(rng) } else { mcq_candidate(rng, w) };
        if split_of(&format!("{question}\n{gold}")) != split {
            continue;
        }
        wrong.sort();
        wrong.dedup();
        let picks = rng.distinct(wrong.len(), 3);
        let answer = at.unwrap_or_else(|| rng.below(4));
        let mut others = picks.into_iter().map(|i| capitalize_like(&wrong[i], &gold));
        let options = (0..4)
            .map(|i| if i == answer { gold.clone() } else { others.next().expect("three distractors") })
            .collect();
        return McqRecord::new(question, options, answer);
    }
}

/// Distractors take the gold answer's capitalisation, so case gives nothing away.
pub(super) fn capitalize_like(s: &str, gold: &str) -> String {
    if gold.starts_with(char::is_uppercase) { capitalize(s) } else { s.to_string() }
}
