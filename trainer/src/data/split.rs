//! The train/validation partition of the corpus: by a hash of each document's text, so
//! the splits never share a document.

/// One in `VALIDATION_MODULUS` documents (by a hash of the text; for `mcq`, of the
/// question and its answer) belongs to the validation split, so the splits never share
/// a document.
pub const VALIDATION_MODULUS: u64 = 8;

/// Which document stream. The splits use distinct random streams and partition the
/// possible documents (`mcq`: question-answer pairs) by hash, so they are disjoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training stream.
    Train,
    /// Held-out documents for evaluation.
    Validation,
}

impl Split {
    pub(crate) fn index(self) -> u64 {
        match self {
            Split::Train => 0,
            Split::Validation => 1,
        }
    }

    /// Lowercase name, used in cache file names.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
        }
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

pub(crate) fn split_of(text: &str) -> Split {
    if fnv1a(text).is_multiple_of(VALIDATION_MODULUS) { Split::Validation } else { Split::Train }
}
