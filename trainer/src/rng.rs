//! libtorch's default RNG is process-global: whoever seeds it and then draws (model
//! init, GRPO sampling) holds [`GLOBAL_RNG`], so two trainers (or tests) in one process
//! cannot interleave.

/// Held while seeding libtorch's default generator and drawing from it.
pub static GLOBAL_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());
