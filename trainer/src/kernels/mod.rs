//! The kernels the model runs: the SDPA backend switches ([`sdp`]), SwiGLU
//! ([`swiglu`]) and RoPE ([`rope`]) as single autograd nodes, which kernels compute
//! them ([`choice`]), and the timed trials that choose on CUDA ([`trials`],
//! [`attention`], [`tune`]).

pub mod attention;
pub mod choice;
pub mod rope;
pub mod sdp;
pub mod swiglu;
pub mod trials;
pub mod tune;
