//! The kernels the model runs: the SDPA backend switches ([`sdp`]), SwiGLU
//! ([`swiglu`]), RoPE ([`rope`]) and the residual RMSNorm ([`norm`]) as single autograd
//! nodes, the loss chunk ([`loss`]), which kernels compute them ([`choice`]), and the
//! timed trials that choose on CUDA ([`trials`], [`attention`], [`tune`]).

pub mod attention;
pub mod choice;
pub mod loss;
pub mod norm;
pub mod rope;
pub mod sdp;
pub mod swiglu;
pub mod trials;
pub mod tune;
