//! The shape every slow-member policy shares, pure: the slowest member and the median of
//! the others, which it is then held against.

/// The member of `items` with the largest `key`, with the median of the others' keys;
/// `None` with fewer than two members.
pub fn slowest<T>(items: &[T], key: impl Fn(&T) -> f64) -> Option<(&T, f64)> {
    let (i, slow) = items.iter().enumerate().max_by(|a, b| key(a.1).total_cmp(&key(b.1)))?;
    let mut others: Vec<f64> = items.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, t)| key(t)).collect();
    if others.is_empty() {
        return None;
    }
    others.sort_by(f64::total_cmp);
    let n = others.len();
    let median = if n % 2 == 1 { others[n / 2] } else { (others[n / 2 - 1] + others[n / 2]) / 2.0 };
    Some((slow, median))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_and_the_median_of_the_others() {
        // The values, and the slowest with the others' median.
        type Case<'a> = (&'a [f64], Option<(f64, f64)>);
        let cases: [Case; 5] = [
            (&[], None),
            (&[1.0], None),
            (&[1.0, 3.0], Some((3.0, 1.0))),
            (&[2.0, 9.0, 1.0], Some((9.0, 1.5))),
            (&[2.0, 9.0, 1.0, 4.0], Some((9.0, 2.0))),
        ];
        for (values, want) in cases {
            assert_eq!(slowest(values, |v| *v).map(|(s, m)| (*s, m)), want, "{values:?}");
        }
    }
}
