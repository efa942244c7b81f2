//! Variable-length flash attention (csrc/varlen.cpp): the documents of a packed batch,
//! each attending causally within itself, through ATen's `_flash_attention_forward`
//! and its autograd node. CUDA only, in bf16 or f16; elsewhere an error naming why.

use std::ffi::c_char;

use tch::{TchError, Tensor};
use torch_sys::C_tensor;

use super::message::take_message;

unsafe extern "C" {
    fn shim_flash_varlen(
        q: *const C_tensor,
        k: *const C_tensor,
        v: *const C_tensor,
        cu_seqlens: *const C_tensor,
        max_seqlen: i64,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
}

/// Attention of `q` (tokens, n_head, d_head) over `k`, `v` (tokens, n_kv_head, d_head)
/// within each document `cu_seqlens[i]..cu_seqlens[i + 1]` (int32, from 0 to tokens),
/// causal; `max_seqlen` is the longest document. Returns (tokens, n_head, d_head).
pub fn flash_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens: &Tensor,
    max_seqlen: i64,
) -> Result<Tensor, TchError> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: live tensors; on success the shim hands us a new at::Tensor*.
    let err =
        unsafe { shim_flash_varlen(q.as_ptr(), k.as_ptr(), v.as_ptr(), cu_seqlens.as_ptr(), max_seqlen, &mut out) };
    take_message(err).map_or(Ok(()), |m| Err(TchError::Torch(format!("flash_varlen: {m}"))))?;
    // SAFETY: a heap at::Tensor that tch's Tensor takes ownership of.
    Ok(unsafe { Tensor::from_ptr(out) })
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;

    #[test]
    fn off_cuda_it_says_so() {
        let x = Tensor::zeros([6, 2, 8], (Kind::BFloat16, Device::Cpu));
        let cu = Tensor::from_slice(&[0i32, 2, 6]);
        let e = flash_varlen(&x, &x, &x, &cu, 4).unwrap_err().to_string();
        assert!(e.contains("flash varlen attention runs on CUDA only, not on cpu"), "{e}");
    }

    /// On a GPU, varlen flash over two documents equals SDPA on each alone, with their
    /// gradients, in bf16 with grouped K/V heads.
    #[cfg(feature = "cuda")]
    #[test]
    fn varlen_flash_equals_each_document_alone_on_cuda() {
        if !tch::Cuda::is_available() {
            return;
        }
        let device = Device::Cuda(0);
        tch::manual_seed(3);
        let (hq, hk, d) = (8, 2, 64);
        let lengths = [37i64, 91, 1, 127];
        let total: i64 = lengths.iter().sum();
        let randn = |h: i64| Tensor::randn([total, h, d], (Kind::BFloat16, device)).set_requires_grad(true);
        let (q, k, v) = (randn(hq), randn(hk), randn(hk));
        let mut cu = vec![0i32];
        for l in lengths {
            cu.push(cu.last().unwrap() + l as i32);
        }
        let cu = Tensor::from_slice(&cu).to_device(device);
        let g = Tensor::randn([total, hq, d], (Kind::BFloat16, device));
        let y = flash_varlen(&q, &k, &v, &cu, 127).unwrap();
        let grads = Tensor::run_backward(&[(&y * &g).sum(Kind::Float)], &[&q, &k, &v], false, false);
        let mut start = 0;
        for l in lengths {
            let part = |t: &Tensor| t.detach().narrow(0, start, l).transpose(0, 1).unsqueeze(0).set_requires_grad(true);
            let (qa, ka, va) = (part(&q), part(&k), part(&v));
            let ya = Tensor::scaled_dot_product_attention(&qa, &ka, &va, None::<Tensor>, 0.0, true, None, true);
            let ga = g.narrow(0, start, l).transpose(0, 1).unsqueeze(0);
            let want = Tensor::run_backward(&[(&ya * &ga).sum(Kind::Float)], &[&qa, &ka, &va], false, false);
            let close = |a: &Tensor, b: &Tensor, what: &str| {
                let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
                let diff = (&a - &b).abs().max().double_value(&[]);
                let scale = b.abs().max().double_value(&[]).max(1.0);
                assert!(diff <= 2e-2 * scale, "document of {l}: {what} differs by {diff} (largest {scale})");
            };
            close(&y.narrow(0, start, l), &ya.squeeze_dim(0).transpose(0, 1), "output");
            for (i, what) in ["dq", "dk", "dv"].iter().enumerate() {
                close(&grads[i].narrow(0, start, l), &want[i].squeeze_dim(0).transpose(0, 1), what);
            }
            start += l;
        }
    }
}
