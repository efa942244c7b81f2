//! Which worker of N prepares each input file (`inputs::Unit`), balanced by bytes.

/// The units (their indices, in listing order) of each of `workers` workers: longest
/// first, each unit goes to the worker with the fewest bytes so far, ties to the larger
/// unit's lower index and to the lower worker. Depends on the sizes and the count only,
/// so every worker computes the same assignment from the same listing.
pub fn assign(bytes: &[u64], workers: usize) -> Vec<Vec<usize>> {
    let workers = workers.max(1);
    let mut order: Vec<usize> = (0..bytes.len()).collect();
    order.sort_by(|&a, &b| bytes[b].cmp(&bytes[a]).then(a.cmp(&b)));
    let mut load = vec![0u64; workers];
    let mut out = vec![Vec::new(); workers];
    for unit in order {
        let w = (0..workers).min_by_key(|&w| (load[w], w)).expect("at least one worker");
        load[w] += bytes[unit];
        out[w].push(unit);
    }
    for units in &mut out {
        units.sort_unstable();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_assignment_balances_bytes_and_covers_every_unit_once() {
        struct Case {
            name: &'static str,
            bytes: Vec<u64>,
            workers: usize,
            want: Vec<Vec<usize>>,
        }
        let cases = [
            Case { name: "one worker takes all", bytes: vec![5, 1, 3], workers: 1, want: vec![vec![0, 1, 2]] },
            Case {
                name: "largest first to the emptiest",
                bytes: vec![10, 7, 6, 3, 2],
                workers: 2,
                // 10 → w0; 7 → w1; 6 → w1 (7 < 10); 3 → w0 (10 < 13); 2 → w0 (13 = 13: lower worker).
                want: vec![vec![0, 3, 4], vec![1, 2]],
            },
            Case {
                name: "equal sizes go round in index order",
                bytes: vec![4, 4, 4, 4, 4],
                workers: 3,
                want: vec![vec![0, 3], vec![1, 4], vec![2]],
            },
            Case {
                name: "more workers than units",
                bytes: vec![9, 1],
                workers: 4,
                want: vec![vec![0], vec![1], vec![], vec![]],
            },
            Case { name: "no units", bytes: vec![], workers: 2, want: vec![vec![], vec![]] },
            Case { name: "zero workers means one", bytes: vec![1, 2], workers: 0, want: vec![vec![0, 1]] },
        ];
        for c in cases {
            let got = assign(&c.bytes, c.workers);
            assert_eq!(got, c.want, "{}", c.name);
            let mut all: Vec<usize> = got.concat();
            all.sort_unstable();
            assert_eq!(all, (0..c.bytes.len()).collect::<Vec<_>>(), "{}: every unit once", c.name);
        }
    }

    #[test]
    fn no_worker_gets_more_than_the_mean_plus_the_largest_unit() {
        let bytes: Vec<u64> = (0..200u64).map(|i| 1 + (crate::rng::splitmix64(i) % 5_000_000)).collect();
        for workers in [2, 3, 7, 16] {
            let total: u64 = bytes.iter().sum();
            let largest = *bytes.iter().max().unwrap();
            for units in assign(&bytes, workers) {
                let load: u64 = units.iter().map(|&u| bytes[u]).sum();
                assert!(load <= total / workers as u64 + largest, "{workers} workers: {load}");
            }
        }
    }
}
