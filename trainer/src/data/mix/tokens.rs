//! Token storage: a mix source's tokens in memory, in local shards or in remote shards.

use std::borrow::Cow;
use std::sync::Arc;

use crate::Error;
use crate::data::remote::RemoteShards;
use crate::data::shard::ShardSet;

/// One source of a mix: its tokens and its weight.
#[derive(Clone, Debug)]
pub struct SourceTokens {
    /// The mix entry's name, for logs and per-source losses.
    pub name: String,
    /// Positive; the mix normalises the weights to sum to 1.
    pub weight: f64,
    pub tokens: Tokens,
}

/// A source's token stream: one block in memory, memory-mapped local shards, or
/// shards in S3 behind a bounded cache. Samples never cross a block (shard) boundary.
#[derive(Clone, Debug)]
pub enum Tokens {
    Memory(Arc<[u32]>),
    Shards(Arc<ShardSet>),
    Remote(Arc<RemoteShards>),
}

impl From<Vec<u32>> for Tokens {
    fn from(v: Vec<u32>) -> Tokens {
        Tokens::Memory(v.into())
    }
}

impl Tokens {
    /// Token count of each block.
    pub fn blocks(&self) -> Vec<u64> {
        match self {
            Tokens::Memory(t) => vec![t.len() as u64],
            Tokens::Shards(s) => s.shards.iter().map(|s| s.len()).collect(),
            Tokens::Remote(r) => r.entries().iter().map(|e| e.tokens).collect(),
        }
    }

    pub fn len(&self) -> u64 {
        self.blocks().iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens `start..start + len` of block `b` (fetching a remote shard if needed).
    pub fn slice(&self, b: usize, start: u64, len: usize) -> Result<Cow<'_, [u32]>, Error> {
        Ok(match self {
            Tokens::Memory(t) => Cow::Borrowed(&t[start as usize..start as usize + len]),
            Tokens::Shards(s) => s.shards[b].tokens(start, len),
            Tokens::Remote(r) => Cow::Owned(r.shard(b)?.tokens(start, len).into_owned()),
        })
    }
}
