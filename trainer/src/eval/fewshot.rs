//! Few-shot examples drawn as lm-evaluation-harness 0.4 draws them, so that a question
//! is asked after the same examples, in the same order, for the same seed:
//!
//! - MMLU (lm-eval's `first_n` sampler, per subject task): the first `k` examples of
//!   the question's subject in the pool.
//! - The other formats (lm-eval's default `ContextSampler`): `random.Random(seed)`,
//!   seeded once for the set, draws `random.sample(pool, k)` for each question in turn,
//!   so a question's examples depend on every draw before it.
//!
//! When the pool is the evaluated set itself, lm-eval draws `k + 1` and drops the
//! question (`first_n` drops it before taking `k`); both are done here. Two differences,
//! where lm-eval has no answer: a pool with fewer than `k` examples (lm-eval stops with
//! an error) gives all it has, and an MMLU question whose subject the pool lacks gets
//! the pool's first `k`.

use rand_mt::Mt;

use crate::data::mcq::{McqFormat, McqRecord};

/// CPython's `random.Random(seed)`: MT19937 seeded by `init_by_array` with the seed's
/// 32-bit words, least significant first, and its `sample`.
pub struct PythonRandom(Mt);

impl PythonRandom {
    pub fn new(seed: u64) -> PythonRandom {
        let key: Vec<u32> = if seed >> 32 == 0 { vec![seed as u32] } else { vec![seed as u32, (seed >> 32) as u32] };
        PythonRandom(Mt::new_with_key(key))
    }

    /// `getrandbits(k)` for 1 ≤ k ≤ 32.
    fn getrandbits(&mut self, k: u32) -> u32 {
        self.0.next_u32() >> (32 - k)
    }

    /// `_randbelow(n)`: uniform in [0, n), by rejection on `n.bit_length()` bits.
    fn randbelow(&mut self, n: usize) -> usize {
        let n = u32::try_from(n).expect("a few-shot pool has fewer than 2^32 examples");
        let k = u32::BITS - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r as usize;
            }
        }
    }

    /// `sample(population, k)`: `k` distinct elements in selection order (`k` ≤ its length).
    pub fn sample<T: Copy>(&mut self, population: &[T], k: usize) -> Vec<T> {
        let n = population.len();
        assert!(k <= n, "sample of {k} from {n}");
        let mut setsize = 21;
        if k > 5 {
            setsize += 4usize.pow(((k * 3) as f64).log(4.0).ceil() as u32);
        }
        if n <= setsize {
            let mut pool = population.to_vec();
            (0..k)
                .map(|i| {
                    let j = self.randbelow(n - i);
                    let picked = pool[j];
                    pool[j] = pool[n - i - 1];
                    picked
                })
                .collect()
        } else {
            let mut selected = std::collections::HashSet::new();
            (0..k)
                .map(|_| {
                    loop {
                        let j = self.randbelow(n);
                        if selected.insert(j) {
                            return population[j];
                        }
                    }
                })
                .collect()
        }
    }
}

/// Few-shot examples: `k` per question from `pool`, drawn with `seed`. `pool_is_set`:
/// the pool is the evaluated set itself, so a question never answers itself.
#[derive(Clone, Copy, Debug)]
pub struct Fewshot<'a> {
    pub pool: &'a [McqRecord],
    pub k: usize,
    pub seed: u64,
    pub pool_is_set: bool,
}

impl Fewshot<'_> {
    /// Each question's examples, for `records` in order (the draws chain).
    pub fn draw<'p>(&self, format: McqFormat, records: &[McqRecord]) -> Vec<Vec<&'p McqRecord>>
    where
        Self: 'p,
    {
        let pool: &'p [McqRecord] = self.pool;
        let mut rng = PythonRandom::new(self.seed);
        records
            .iter()
            .map(|r| {
                if self.k == 0 || pool.is_empty() {
                    return Vec::new();
                }
                let not_itself = |p: &&McqRecord| !(self.pool_is_set && *p == r);
                if format == McqFormat::Mmlu {
                    let subject: Vec<&McqRecord> =
                        pool.iter().filter(|p| r.subject.is_some() && p.subject == r.subject).collect();
                    let from = if subject.is_empty() { pool.iter().collect() } else { subject };
                    return from.into_iter().filter(not_itself).take(self.k).collect();
                }
                let all: Vec<&McqRecord> = pool.iter().collect();
                let extra = usize::from(self.pool_is_set);
                let drawn = rng.sample(&all, (self.k + extra).min(all.len()));
                drawn.into_iter().filter(not_itself).take(self.k).collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::task::tests::q;

    /// `random.Random(1234).sample(range(10), 4)` and the next draws of the same
    /// stream, from CPython 3.11; a seed above 2^32 and a population above the set-size
    /// threshold take CPython's other paths.
    #[test]
    fn draws_equal_cpythons() {
        let population: Vec<usize> = (0..10).collect();
        let mut rng = PythonRandom::new(1234);
        assert_eq!(rng.sample(&population, 4), [7, 1, 0, 9]);
        assert_eq!(rng.sample(&population, 3), [9, 0, 1]);
        assert_eq!(rng.sample(&population[..3], 3), [0, 1, 2]);
        let big: Vec<usize> = (0..100).collect();
        assert_eq!(PythonRandom::new(1234).sample(&big, 6), [99, 56, 14, 0, 11, 74]);
        assert_eq!(PythonRandom::new((1 << 32) + 5).sample(&population, 5), [2, 7, 4, 8, 0]);
    }

    #[test]
    fn mmlu_takes_the_subjects_first_examples_and_never_the_question() {
        let pool: Vec<McqRecord> =
            (0..6).map(|i| q(&format!("q{i}"), Some(if i % 2 == 0 { "anatomy" } else { "virology" }))).collect();
        let shots = Fewshot { pool: &pool, k: 2, seed: 7, pool_is_set: true };
        let names = |drawn: Vec<Vec<&McqRecord>>| -> Vec<Vec<String>> {
            drawn.into_iter().map(|s| s.into_iter().map(|r| r.question.clone()).collect()).collect()
        };
        let drawn = names(shots.draw(McqFormat::Mmlu, &pool[..3]));
        assert_eq!(drawn, [vec!["q2", "q4"], vec!["q3", "q5"], vec!["q0", "q4"]]);
        let other = [q("y", Some("law"))];
        assert_eq!(names(shots.draw(McqFormat::Mmlu, &other)), [vec!["q0", "q1"]], "no law examples: the pool's first");
    }

    /// The other formats draw k + 1 from one stream when the pool is the set and drop the
    /// question; the draws chain from question to question.
    #[test]
    fn other_formats_draw_from_one_stream() {
        let pool: Vec<McqRecord> = (0..10).map(|i| q(&format!("q{i}"), None)).collect();
        let shots = Fewshot { pool: &pool, k: 3, seed: 1234, pool_is_set: true };
        let drawn: Vec<Vec<&str>> = shots
            .draw(McqFormat::Arc, &pool[..2])
            .into_iter()
            .map(|s| s.into_iter().map(|r| r.question.as_str()).collect())
            .collect();
        // CPython: sample(range(10), 4) = [7, 1, 0, 9], then [9, 0, 1, 8]; q0 and q1 drop themselves.
        assert_eq!(drawn, [vec!["q7", "q1", "q9"], vec!["q9", "q0", "q8"]]);
        let apart = Fewshot { pool_is_set: false, ..shots };
        assert_eq!(apart.draw(McqFormat::Arc, &pool[..1])[0].len(), 3);
        let small = Fewshot { pool: &pool[..2], ..shots };
        assert_eq!(small.draw(McqFormat::Medqa, &pool[..1])[0].len(), 1, "all a short pool has, less the question");
    }
}
