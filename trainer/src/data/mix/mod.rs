//! Token streams and the deterministic weighted mix: the embedded corpus's token cache,
//! token storage, unigram entropy, and the sampler with its keyed permutation.

mod entropy;
mod permutation;
mod sampler;
mod token_cache;
mod tokens;

pub use entropy::unigram_entropy;
pub(crate) use permutation::permute;
pub use sampler::{Batch, Mix};
pub use token_cache::{embedded_source_tokens, embedded_source_tokens_in};
pub use tokens::{SourceTokens, Tokens};
