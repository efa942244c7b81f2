//! Unigram entropy of a token stream: the loss a model that ignores context reaches.

use std::collections::HashMap;

/// Entropy, in nats per token, of the unigram distribution of `tokens` (0 when empty):
/// the loss of a model that ignores context, which a trained model must beat.
pub fn unigram_entropy(tokens: &[u32]) -> f64 {
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for t in tokens {
        *counts.entry(*t).or_default() += 1;
    }
    let n = tokens.len() as f64;
    -counts.values().map(|&c| (c as f64 / n) * (c as f64 / n).ln()).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy() {
        assert_eq!(unigram_entropy(&[]), 0.0);
        assert!((unigram_entropy(&[1, 2, 3, 4]) - 4f64.ln()).abs() < 1e-12);
    }
}
