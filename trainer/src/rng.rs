//! Randomness shared by every layer: the lock on libtorch's process-global generator,
//! and the stateless hash behind every seeded, position-addressable choice.
//!
//! libtorch's default RNG is process-global: whoever seeds it and then draws (model
//! init, GRPO sampling) holds [`GLOBAL_RNG`], so two trainers (or tests) in one process
//! cannot interleave.

/// Held while seeding libtorch's default generator and drawing from it.
pub static GLOBAL_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// SplitMix64: a fast, well-mixed 64-bit hash used for seeded, position-addressable
/// randomness (window orders, validation splits).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
