//! Benchmarks: the training step against `torch_reference.py` ([`step`]), the fused
//! kernels ([`kernels`]), data parallelism ([`ddp`]), the memory planner against the
//! allocator ([`memory`]), the data loader ([`data`]), GRPO's sampler ([`generate`]) and
//! the stall of a background checkpoint ([`checkpoint`]).

pub mod checkpoint;
pub mod data;
pub mod ddp;
pub mod generate;
pub mod kernels;
pub mod memory;
pub mod step;
