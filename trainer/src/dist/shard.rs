//! ZeRO's partition of the parameters over ranks. The parameters are laid out in the
//! gradient reducer's flat buckets (each bucket's members in index order, end to
//! end); each bucket is padded to a multiple of the world size and cut into one
//! contiguous, equal shard per rank. A rank owns its shard of every bucket, so shards
//! are balanced to within a bucket's padding and line up with the buckets that are
//! reduce-scattered and all-gathered.
//!
//! A shard cuts across parameters: its [`Segment`]s are the pieces of each parameter
//! it holds, as element ranges of the flattened parameter.
//!
//! Members start, and shards are cut, at multiples of an alignment (in elements). With
//! [`CACHE_LINE_BYTES`] worth of elements, every piece of a parameter starts on the
//! boundary where ATen's fused CPU optimizers start a task, so each element takes the
//! same vector or scalar path as when the whole parameter is stepped, and a sharded
//! step rounds exactly as a replicated one.

use std::ops::Range;

/// The unit ATen's fused CPU optimizers cut a tensor into (`cache_line_size` in
/// FusedAdamKernel.cpp); a multiple of every vector width.
pub const CACHE_LINE_BYTES: i64 = 64;

/// The alignment, in elements, for parameters of dtypes `kinds`: a cache line of the
/// narrowest is a whole number of cache lines' worth of elements of every wider one.
pub fn cache_line_alignment(kinds: impl IntoIterator<Item = tch::Kind>) -> i64 {
    let narrowest = kinds.into_iter().map(|k| k.elt_size_in_bytes() as i64).min().unwrap_or(4);
    CACHE_LINE_BYTES / narrowest
}

/// One parameter's place in its bucket's flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Index of the parameter in the list the layout was built from.
    pub param: usize,
    /// Element offset of the parameter in the bucket's flat buffer (a multiple of the
    /// layout's alignment; the gaps are padding).
    pub offset: i64,
    pub numel: i64,
}

/// One bucket: its members and the shard this rank owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketShards {
    pub members: Vec<Member>,
    /// Elements up to the end of the last member, alignment gaps included.
    pub len: i64,
    /// `len` rounded up to a multiple of the world size times the alignment: the
    /// length of the buffers that are reduce-scattered and all-gathered.
    pub padded_len: i64,
    /// This rank's elements of the flat buffer (may reach into the padding, or lie
    /// wholly in it).
    pub own: Range<i64>,
}

impl BucketShards {
    /// Elements per rank.
    pub fn shard_len(&self) -> i64 {
        self.own.end - self.own.start
    }

    /// The pieces of parameters this rank owns, in flat order.
    pub fn segments(&self) -> Vec<Segment> {
        self.members
            .iter()
            .filter_map(|m| {
                let start = self.own.start.max(m.offset);
                let end = self.own.end.min(m.offset + m.numel);
                (start < end).then(|| Segment {
                    param: m.param,
                    elements: (start - m.offset)..(end - m.offset),
                    shard_offset: start - self.own.start,
                })
            })
            .collect()
    }
}

/// The piece of one parameter that a rank owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub param: usize,
    /// Element range of the flattened parameter.
    pub elements: Range<i64>,
    /// Where the piece starts in the rank's shard of the bucket.
    pub shard_offset: i64,
}

impl Segment {
    pub fn len(&self) -> i64 {
        self.elements.end - self.elements.start
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Every bucket's shards for one rank of `world`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    pub world: u32,
    pub rank: u32,
    pub buckets: Vec<BucketShards>,
}

impl ShardLayout {
    /// The layout of parameters with `numels`, in the buckets `bucket_of` assigns
    /// (as [`super::reducer::assign_buckets`] does; bucket indices dense from 0), with
    /// members and shard boundaries at multiples of `align` elements.
    pub fn new(numels: &[i64], bucket_of: &[i64], world: u32, rank: u32, align: i64) -> ShardLayout {
        assert_eq!(numels.len(), bucket_of.len(), "one bucket per parameter");
        assert!(world >= 1 && rank < world, "rank {rank} of world {world}");
        assert!(align >= 1, "alignment {align}");
        let up = |x: i64, m: i64| (x + m - 1) / m * m;
        let n_buckets = bucket_of.iter().map(|&b| b as usize + 1).max().unwrap_or(0);
        let mut members: Vec<Vec<Member>> = vec![Vec::new(); n_buckets];
        let mut filled = vec![0i64; n_buckets];
        for (param, (&numel, &b)) in numels.iter().zip(bucket_of).enumerate() {
            let b = b as usize;
            let offset = up(filled[b], align);
            members[b].push(Member { param, offset, numel });
            filled[b] = offset + numel;
        }
        let w = i64::from(world);
        let buckets = members
            .into_iter()
            .zip(filled)
            .map(|(members, len)| {
                let padded_len = up(len, w * align);
                let shard = padded_len / w;
                let own = (i64::from(rank) * shard)..(i64::from(rank) * shard + shard);
                BucketShards { members, len, padded_len, own }
            })
            .collect();
        ShardLayout { world, rank, buckets }
    }

    /// Elements this rank owns, padding included.
    pub fn shard_elements(&self) -> i64 {
        self.buckets.iter().map(BucketShards::shard_len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(param: usize, elements: Range<i64>, shard_offset: i64) -> Segment {
        Segment { param, elements, shard_offset }
    }

    struct Case {
        numels: &'static [i64],
        buckets: &'static [i64],
        world: u32,
        rank: u32,
        /// The segments of each bucket.
        want: Vec<Vec<Segment>>,
    }

    #[test]
    fn shards_cut_buckets_evenly_across_parameters() {
        let case = |numels, buckets, world, rank, want| Case { numels, buckets, world, rank, want };
        let cases = [
            case(&[3, 5, 2], &[0, 0, 0], 2, 0, vec![vec![seg(0, 0..3, 0), seg(1, 0..2, 3)]]),
            case(&[3, 5, 2], &[0, 0, 0], 2, 1, vec![vec![seg(1, 2..5, 0), seg(2, 0..2, 3)]]),
            // 3 elements over 2 ranks: 4 padded, rank 1 holds one element and a pad.
            case(&[3], &[0], 2, 1, vec![vec![seg(0, 2..3, 0)]]),
            // A rank whose shard is all padding holds nothing of that bucket.
            case(&[1], &[0], 3, 2, vec![vec![]]),
            // Two buckets: a rank owns its shard of each.
            case(&[4, 6], &[1, 0], 2, 1, vec![vec![seg(1, 3..6, 0)], vec![seg(0, 2..4, 0)]]),
            case(&[4, 6], &[1, 0], 3, 0, vec![vec![seg(1, 0..2, 0)], vec![seg(0, 0..2, 0)]]),
            case(&[7], &[0], 1, 0, vec![vec![seg(0, 0..7, 0)]]),
        ];
        for Case { numels, buckets, world, rank, want } in cases {
            let layout = ShardLayout::new(numels, buckets, world, rank, 1);
            let got: Vec<Vec<Segment>> = layout.buckets.iter().map(BucketShards::segments).collect();
            assert_eq!(got, want, "numels {numels:?} buckets {buckets:?} world {world} rank {rank}");
        }
    }

    #[test]
    fn every_element_belongs_to_exactly_one_rank() {
        let numels = [5i64, 1, 12, 7, 3, 64, 9];
        let buckets = [2i64, 2, 1, 1, 1, 0, 0];
        for world in 1..=5u32 {
            let mut seen: Vec<Vec<u32>> = numels.iter().map(|&n| vec![0; n as usize]).collect();
            for rank in 0..world {
                let layout = ShardLayout::new(&numels, &buckets, world, rank, 1);
                for b in &layout.buckets {
                    assert_eq!(b.padded_len % i64::from(world), 0);
                    assert!(b.padded_len - b.len < i64::from(world), "padding is under one element per rank");
                    for s in b.segments() {
                        assert!(s.shard_offset + s.len() <= b.shard_len());
                        for e in s.elements.clone() {
                            seen[s.param][e as usize] += 1;
                        }
                    }
                }
            }
            assert!(seen.iter().flatten().all(|&n| n == 1), "world {world}: {seen:?}");
        }
    }

    #[test]
    fn shards_are_balanced_to_within_the_padding() {
        let numels = [1000i64, 24, 333];
        let buckets = [0i64, 0, 1];
        for world in 1..=8u32 {
            let sizes: Vec<i64> =
                (0..world).map(|r| ShardLayout::new(&numels, &buckets, world, r, 1).shard_elements()).collect();
            assert!(sizes.iter().all(|&s| s == sizes[0]), "{sizes:?}");
            assert!(sizes[0] * i64::from(world) - 1357 < 2 * i64::from(world), "{sizes:?}");
        }
    }

    #[test]
    fn aligned_pieces_start_on_the_alignment_relative_to_their_parameter() {
        let numels = [37i64, 100, 5, 64, 250];
        let buckets = [0i64, 0, 0, 1, 1];
        for world in 1..=4u32 {
            let mut seen: Vec<Vec<u32>> = numels.iter().map(|&n| vec![0; n as usize]).collect();
            for rank in 0..world {
                let layout = ShardLayout::new(&numels, &buckets, world, rank, 16);
                for b in &layout.buckets {
                    assert!(b.members.iter().all(|m| m.offset % 16 == 0), "{b:?}");
                    assert_eq!(b.shard_len() % 16, 0);
                    for s in b.segments() {
                        let numel = numels[s.param];
                        assert_eq!(s.elements.start % 16, 0, "world {world} rank {rank} {s:?}");
                        assert!(s.elements.end == numel || s.elements.end % 16 == 0, "world {world} rank {rank} {s:?}");
                        for e in s.elements.clone() {
                            seen[s.param][e as usize] += 1;
                        }
                    }
                }
            }
            assert!(seen.iter().flatten().all(|&n| n == 1), "world {world}");
        }
    }
}
