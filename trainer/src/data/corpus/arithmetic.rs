//! Arithmetic word problems.

use super::facts::FIRST_NAMES;
use super::rng::Rng;

pub(super) const ITEMS: &[&str] = &["apples", "books", "coins", "eggs", "pens", "stones", "cards", "shells"];

pub(super) fn arithmetic_line(rng: &mut Rng) -> String {
    match rng.below(8) {
        0 | 1 => {
            let (a, b) = (rng.range(0, 99), rng.range(0, 99));
            format!("{a} + {b} = {}.", a + b)
        }
        2 => {
            let (a, b) = (rng.range(0, 99), rng.range(0, 99));
            let (a, b) = (a.max(b), a.min(b));
            format!("{a} - {b} = {}.", a - b)
        }
        3 | 4 => {
            let (a, b) = (rng.range(0, 12), rng.range(0, 12));
            format!("{a} * {b} = {}.", a * b)
        }
        5 => {
            let (a, b) = (rng.range(1, 50), rng.range(1, 50));
            match rng.below(2) {
                0 => format!("What is {a} plus {b}? The answer is {}.", a + b),
                _ => format!("What is {} minus {b}? The answer is {a}.", a + b),
            }
        }
        6 => {
            let (a, b) = (rng.range(2, 12), rng.range(2, 12));
            format!("What is {a} times {b}? The answer is {}.", a * b)
        }
        _ => {
            let name = rng.pick(FIRST_NAMES);
            let item = rng.pick(ITEMS);
            let (a, b) = (rng.range(2, 40), rng.range(1, 20));
            match rng.below(3) {
                0 => format!("{name} has {a} {item} and gets {b} more. Now {name} has {a} + {b} = {} {item}.", a + b),
                1 => {
                    let (a, b) = (a.max(b), a.min(b));
                    format!("{name} has {a} {item} and gives away {b}. Now {name} has {a} - {b} = {} {item}.", a - b)
                }
                _ => {
                    let (a, b) = (a % 9 + 2, b % 9 + 2);
                    format!("{name} has {a} bags with {b} {item} in each. That is {a} * {b} = {} {item}.", a * b)
                }
            }
        }
    }
}

pub(super) fn arithmetic_doc(rng: &mut Rng) -> String {
    let n = rng.range(3, 8);
    (0..n).map(|_| arithmetic_line(rng)).collect::<Vec<_>>().join("\n")
}
