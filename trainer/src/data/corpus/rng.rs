//! The corpus's randomness, and small text helpers its generators share.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

pub(super) struct Rng(ChaCha8Rng);

impl Rng {
    pub(super) fn new(seed: u64, stream: u64) -> Self {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        r.set_stream(stream);
        Rng(r)
    }

    /// Uniform in 0..n (n is tiny, so the modulo bias is negligible).
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n as u64) as usize
    }

    pub(super) fn range(&mut self, lo: u32, hi_inclusive: u32) -> u32 {
        lo + self.below((hi_inclusive - lo + 1) as usize) as u32
    }

    pub(super) fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    pub(super) fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }

    pub(super) fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i + 1);
            xs.swap(i, j);
        }
    }

    /// `k` distinct indices from 0..n, in random order.
    pub(super) fn distinct(&mut self, n: usize, k: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..n).collect();
        self.shuffle(&mut all);
        all.truncate(k);
        all
    }
}

pub(super) fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// "a", "a and b", "a, b and c".
pub(super) fn join_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [a] => a.to_string(),
        [rest @ .., last] => format!("{} and {}", rest.join(", "), last),
    }
}

pub(super) fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" }
}
