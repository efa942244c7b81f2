//! A keyed pseudo-random permutation evaluated at one index in O(1).

use crate::rng::splitmix64;

/// A keyed pseudo-random permutation of `0..n` evaluated at `j` in O(1): a balanced
/// four-round Feistel network on the smallest even-bit power of two ≥ n, cycle-walked
/// back into range (at most 4 expected rounds trips).
pub(crate) fn permute(j: u64, n: u64, key: u64) -> u64 {
    debug_assert!(j < n);
    let bits = (64 - (n - 1).leading_zeros()).max(2).div_ceil(2);
    let mask = (1u64 << bits) - 1;
    let mut x = j;
    loop {
        let (mut l, mut r) = (x >> bits, x & mask);
        for round in 0..4u64 {
            let f = splitmix64(key ^ splitmix64(round ^ (r << 8))) & mask;
            (l, r) = (r, l ^ f);
        }
        x = (l << bits) | r;
        if x < n {
            return x;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn permutation_is_a_bijection_and_changes_per_key() {
        for n in [1u64, 2, 3, 5, 16, 17, 100, 1000, 4097] {
            let p: Vec<u64> = (0..n).map(|j| permute(j, n, 42)).collect();
            let set: BTreeSet<u64> = p.iter().copied().collect();
            assert_eq!(set.len() as u64, n);
            assert!(p.iter().all(|&x| x < n));
            if n >= 16 {
                let q: Vec<u64> = (0..n).map(|j| permute(j, n, 43)).collect();
                assert_ne!(p, q, "n = {n}");
                assert_ne!(p, (0..n).collect::<Vec<_>>(), "n = {n}");
            }
        }
    }
}
