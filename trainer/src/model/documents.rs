//! Per-document attention on packed windows (`spec.data.packing: documents`): a token
//! attends only within its own document, and positions restart at each document, so
//! every document in a window is computed as if it were alone (torchtitan's document
//! mask, Hugging Face's `DataCollatorWithFlattening`). A document ends at its
//! end-of-text token, which belongs to it; a window that starts inside a document
//! starts it there.
//!
//! Attention within documents runs as ATen's variable-length flash attention on CUDA in
//! bf16 or f16 (the documents of every row as one run with cumulative lengths; no mask
//! exists), and elsewhere as SDPA with a block-diagonal causal mask, made once per
//! window in the activations' dtype and shared by every block.

use std::sync::OnceLock;

use crds::types::Packing;
use tch::{Kind, TchError, Tensor};

use crate::kernels::loss::IGNORE_INDEX;
use crate::kernels::sdp::AllSdpBackends;

/// Where the documents of a (B, T) window lie.
#[derive(Debug)]
pub struct Documents {
    /// Each token's position within its document: (B, T) int64.
    pub positions: Tensor,
    /// Which of its row's documents each token is in: (B, T) int64.
    doc: Tensor,
    /// [`Self::mask`] as SDPA's additive `attn_mask` (0 or −∞) in the activations'
    /// dtype, made at its first use: varlen flash attention never makes it.
    bias: OnceLock<Tensor>,
    /// On CUDA: every row's documents as one run, for varlen flash attention.
    varlen: Option<Varlen>,
}

/// The documents of a window's rows, row after row, as varlen flash attention takes
/// them.
#[derive(Debug)]
pub struct Varlen {
    /// Where each document starts in the (B·T) tokens, and B·T: (documents + 1) int32.
    pub cu_seqlens: Tensor,
    /// The longest document.
    pub max_len: i64,
}

/// Which kernel attends within documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocumentAttention {
    /// ATen's variable-length flash attention.
    FlashVarlen,
    /// SDPA with the block-diagonal causal mask.
    MaskedSdpa,
}

impl DocumentAttention {
    /// Which runs for activations of `kind` with heads of `d_head` on `device`: flash
    /// varlen takes bf16 or f16, heads of a multiple of 8 up to 256, on CUDA.
    pub fn of(kind: Kind, d_head: i64, device: tch::Device) -> DocumentAttention {
        let flash = device.is_cuda()
            && crate::ffi::shim_built_with_cuda()
            && matches!(kind, Kind::BFloat16 | Kind::Half)
            && d_head % 8 == 0
            && d_head <= 256;
        if flash { DocumentAttention::FlashVarlen } else { DocumentAttention::MaskedSdpa }
    }

    pub fn name(self) -> &'static str {
        match self {
            DocumentAttention::FlashVarlen => "flash varlen",
            DocumentAttention::MaskedSdpa => "SDPA with a document mask",
        }
    }
}

impl Documents {
    /// The documents of `inputs` (B, T), each ending at an `eos` token.
    pub fn of(inputs: &Tensor, eos: i64) -> Result<Documents, TchError> {
        let (b, t) = inputs.size2()?;
        let device = inputs.device();
        let ends = inputs.f_eq(eos)?; // (B, T)
        // A document starts at the window's start and after each end.
        let starts = Tensor::f_cat(&[Tensor::f_ones([b, 1], (Kind::Bool, device))?, ends.f_narrow(1, 0, t - 1)?], 1)?;
        let doc = starts.f_cumsum(1, Kind::Int64)?; // (B, T): which document
        let index = Tensor::f_arange(t, (Kind::Int64, device))?.f_expand([b, t], false)?;
        let zero = Tensor::f_zeros([], (Kind::Int64, device))?;
        let start = index.f_where_self(&starts, &zero)?.f_cummax(1)?.0; // each token's document start
        let positions = index.f_sub(&start)?;
        let varlen = if device.is_cuda() && crate::ffi::shim_built_with_cuda() {
            let first = starts.f_reshape([-1])?.f_nonzero()?.f_squeeze_dim(1)?;
            let end = Tensor::f_full([1], b * t, (Kind::Int64, device))?;
            let cu = Tensor::f_cat(&[first, end], 0)?;
            let lengths = cu.f_narrow(0, 1, cu.size()[0] - 1)?.f_sub(&cu.f_narrow(0, 0, cu.size()[0] - 1)?)?;
            Some(Varlen { cu_seqlens: cu.f_to_kind(Kind::Int)?, max_len: lengths.f_max()?.f_int64_value(&[])? })
        } else {
            None
        };
        Ok(Documents { positions, doc, bias: OnceLock::new(), varlen })
    }

    /// Whether query i may attend key j: same document and j ≤ i. (B, 1, T, T) bool.
    pub fn mask(&self) -> Result<Tensor, TchError> {
        let t = self.doc.size()[1];
        let same = self.doc.f_unsqueeze(2)?.f_eq_tensor(&self.doc.f_unsqueeze(1)?)?; // (B, T, T)
        let causal = Tensor::f_ones([t, t], (Kind::Bool, self.doc.device()))?.f_tril(0)?;
        same.f_logical_and(&causal)?.f_unsqueeze(1)
    }

    /// Attention of `q` (B, n_head, T, d_head) over `k`, `v` (B, n_kv_head, T, d_head),
    /// each token within its document, causal: (B, n_head, T, d_head). `gqa`: K/V have
    /// fewer heads than q.
    pub fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, gqa: bool) -> Result<Tensor, TchError> {
        let (b, hq, t, dh) = q.size4()?;
        match (&self.varlen, DocumentAttention::of(q.kind(), dh, q.device())) {
            (Some(run), DocumentAttention::FlashVarlen) => {
                let flat = |x: &Tensor| -> Result<Tensor, TchError> {
                    let h = x.size()[1];
                    x.f_transpose(1, 2)?.f_reshape([b * t, h, dh]) // (B·T, heads, d_head)
                };
                let y =
                    crate::ffi::varlen::flash_varlen(&flat(q)?, &flat(k)?, &flat(v)?, &run.cu_seqlens, run.max_len)?;
                y.f_view([b, t, hq, dh])?.f_transpose(1, 2)
            }
            _ => {
                let bias = match self.bias.get() {
                    Some(bias) if bias.kind() == q.kind() => bias.shallow_clone(),
                    _ => {
                        let mask = self.mask()?;
                        let zeros = Tensor::f_zeros(mask.size(), (q.kind(), q.device()))?;
                        let bias = zeros.f_masked_fill(&mask.f_logical_not()?, f64::NEG_INFINITY)?;
                        let _ = self.bias.set(bias.shallow_clone());
                        bias
                    }
                };
                // A backend forced for training (cuDNN, flash) may take no mask.
                let _any = AllSdpBackends::enable().map_err(|e| TchError::Torch(e.to_string()))?;
                Tensor::f_scaled_dot_product_attention(q, k, v, Some(&bias), 0.0, false, None, gqa)
            }
        }
    }

    /// A (B, T) window's documents and its targets as `packing` trains them: with
    /// `documents`, [`Documents::of`] and [`Documents::targets`]; with `concat`, none and
    /// the targets as they are.
    pub fn pack(
        packing: Packing,
        inputs: &Tensor,
        targets: &Tensor,
        eos: i64,
    ) -> Result<(Option<Documents>, Tensor), TchError> {
        match packing {
            Packing::Concat => Ok((None, targets.shallow_clone())),
            Packing::Documents => Ok((Some(Documents::of(inputs, eos)?), Documents::targets(inputs, targets, eos)?)),
        }
    }

    /// `targets` (B, T) without the predictions that cross a document boundary: the
    /// target of an `eos` input is the next document's first token, which a document
    /// alone never predicts.
    pub fn targets(inputs: &Tensor, targets: &Tensor, eos: i64) -> Result<Tensor, TchError> {
        targets.f_masked_fill(&inputs.f_eq(eos)?, IGNORE_INDEX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_end_at_eos_and_restart_positions() {
        // Row 0: a document cut by the window's start, "a b <eos>", then "c d <eos>", then "e".
        // Row 1: one document.
        let eos = 0i64;
        let inputs = Tensor::from_slice(&[5i64, 0, 7, 8, 0, 9, 1, 2, 3, 4, 5, 6]).view([2, 6]);
        let d = Documents::of(&inputs, eos).unwrap();
        let mask = d.mask().unwrap();
        assert_eq!(Vec::<i64>::try_from(d.positions.view([-1])).unwrap(), [0, 1, 0, 1, 2, 0, 0, 1, 2, 3, 4, 5]);
        let row0: Vec<Vec<bool>> = (0..6).map(|i| Vec::<bool>::try_from(mask.get(0).get(0).get(i)).unwrap()).collect();
        let want = |i: usize, j: usize| {
            let doc = |k: usize| [0, 0, 1, 1, 1, 2][k];
            j <= i && doc(i) == doc(j)
        };
        for (i, row) in row0.iter().enumerate() {
            assert_eq!(row, &(0..6).map(|j| want(i, j)).collect::<Vec<_>>(), "query {i}");
        }
        let causal = mask.get(1).get(0).to_kind(Kind::Int64).sum(Kind::Int64).int64_value(&[]);
        assert_eq!(causal, 21, "one document: plain causal attention");
        let targets = Documents::targets(&inputs, &inputs.roll([-1], [1]), eos).unwrap();
        assert_eq!(Vec::<i64>::try_from(targets.get(0)).unwrap(), [0, IGNORE_INDEX, 8, 0, IGNORE_INDEX, 5]);
    }
}
