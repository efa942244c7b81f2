//! `trainer export --hf DIR`: what `transformers` needs to use the model without the
//! run: `config.json` and `model.safetensors` (`from_pretrained`), and with the run's
//! tokenizer `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json` and
//! `generation_config.json` (`AutoTokenizer`, `pipeline("text-generation")`).

use std::collections::HashMap;
use std::path::Path;

use crds::presets::{Arch, ModelConfig};
use serde_json::{Value, json};
use tch::{Kind, Tensor};

use crate::data::tokenizer::Tokenizer;
use crate::{Error, io_err};

/// GPT-2's Conv1D layers store weights `(d_in, d_out)`; ours are `(d_out, d_in)`.
fn is_gpt2_conv1d(name: &str) -> bool {
    name.starts_with("transformer.h.")
        && name.ends_with(".weight")
        && [".attn.c_attn.", ".attn.c_proj.", ".mlp.c_fc.", ".mlp.c_proj."].iter().any(|l| name.contains(l))
}

/// The `config.json` of the matching `transformers` class; `eos` is the end-of-text
/// token id, which is also the start and padding token.
pub fn hf_config(cfg: &ModelConfig, dtype: Kind, eos: u32) -> Result<Value, Error> {
    let torch_dtype = match dtype {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        _ => "float32",
    };
    Ok(match cfg.arch {
        Arch::Llama | Arch::Qwen3 => {
            let (class, model_type) =
                if cfg.arch == Arch::Llama { ("LlamaForCausalLM", "llama") } else { ("Qwen3ForCausalLM", "qwen3") };
            json!({
                "architectures": [class],
                "model_type": model_type,
                "hidden_size": cfg.d_model,
                "intermediate_size": cfg.d_ff,
                "num_hidden_layers": cfg.n_layer,
                "num_attention_heads": cfg.n_head,
                "num_key_value_heads": cfg.n_kv_head,
                "head_dim": cfg.d_head,
                "vocab_size": cfg.vocab_size,
                "max_position_embeddings": cfg.max_seq_len,
                "rms_norm_eps": cfg.norm_eps,
                "rope_theta": cfg.rope_theta,
                "rope_scaling": null,
                "hidden_act": "silu",
                "attention_bias": false,
                "attention_dropout": 0.0,
                "mlp_bias": false,
                "use_sliding_window": false,
                "tie_word_embeddings": cfg.tied_embeddings,
                "bos_token_id": eos,
                "eos_token_id": eos,
                "torch_dtype": torch_dtype,
            })
        }
        Arch::Gpt2 => {
            if cfg.n_head * cfg.d_head != cfg.d_model {
                return Err(Error::InvalidSpec(format!(
                    "GPT-2 export needs heads × dHead = dModel ({} × {} ≠ {})",
                    cfg.n_head, cfg.d_head, cfg.d_model
                )));
            }
            json!({
                "architectures": ["GPT2LMHeadModel"],
                "model_type": "gpt2",
                "n_embd": cfg.d_model,
                "n_head": cfg.n_head,
                "n_layer": cfg.n_layer,
                "n_inner": cfg.d_ff,
                "n_positions": cfg.max_seq_len,
                "n_ctx": cfg.max_seq_len,
                "vocab_size": cfg.vocab_size,
                "activation_function": "gelu_new",
                "layer_norm_epsilon": cfg.norm_eps,
                "resid_pdrop": 0.0,
                "embd_pdrop": 0.0,
                "attn_pdrop": 0.0,
                "scale_attn_weights": true,
                "tie_word_embeddings": cfg.tied_embeddings,
                "bos_token_id": eos,
                "eos_token_id": eos,
                "torch_dtype": torch_dtype,
            })
        }
    })
}

/// Writes `dir/config.json` and `dir/model.safetensors` from the model's weights and,
/// given the run's tokenizer, its files ([`write_tokenizer`]); without one the
/// end-of-text id is 0, the embedded tokenizer's.
pub fn export_hf(
    cfg: &ModelConfig,
    weights: &HashMap<String, Tensor>,
    tokenizer: Option<&Tokenizer>,
    dir: &Path,
) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let mut names: Vec<&String> = weights.keys().collect();
    names.sort();
    let dtype = weights.values().next().map_or(Kind::Float, |t| t.kind());
    let tensors = names
        .into_iter()
        .map(|name| {
            let t = &weights[name];
            let t =
                if cfg.arch == Arch::Gpt2 && is_gpt2_conv1d(name) { t.f_transpose(0, 1)? } else { t.shallow_clone() };
            Ok((name.clone(), t.f_contiguous()?))
        })
        .collect::<Result<Vec<_>, tch::TchError>>()?;
    let eos = tokenizer.map_or(0, Tokenizer::eos_id);
    write_json(dir, "config.json", &hf_config(cfg, dtype, eos)?)?;
    Tensor::write_safetensors(&tensors, dir.join("model.safetensors"))?;
    if let Some(t) = tokenizer {
        write_tokenizer(cfg, t, dir)?;
    }
    Ok(())
}

/// The tokenizer's files for `transformers`: `tokenizer.json` as the run encodes (no
/// special tokens added to a text), the fast tokenizer's `tokenizer_config.json` and
/// `special_tokens_map.json` with the end-of-text token as BOS, EOS and padding, and a
/// greedy `generation_config.json` that stops at it.
pub fn write_tokenizer(cfg: &ModelConfig, tokenizer: &Tokenizer, dir: &Path) -> Result<(), Error> {
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, tokenizer.to_json()?).map_err(io_err(&path))?;
    let (eos, eos_id) = (tokenizer.eos_token(), tokenizer.eos_id());
    write_json(
        dir,
        "tokenizer_config.json",
        &json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": eos,
            "eos_token": eos,
            "pad_token": eos,
            "model_max_length": cfg.max_seq_len,
            "add_bos_token": false,
            "add_eos_token": false,
            "clean_up_tokenization_spaces": false,
            "added_tokens_decoder": {
                eos_id.to_string(): {
                    "content": eos, "lstrip": false, "normalized": false, "rstrip": false,
                    "single_word": false, "special": true
                }
            },
        }),
    )?;
    write_json(dir, "special_tokens_map.json", &json!({"bos_token": eos, "eos_token": eos, "pad_token": eos}))?;
    write_json(
        dir,
        "generation_config.json",
        &json!({
            "bos_token_id": eos_id,
            "eos_token_id": eos_id,
            "pad_token_id": eos_id,
            "do_sample": false,
            "max_length": cfg.max_seq_len,
        }),
    )
}

fn write_json(dir: &Path, name: &str, value: &Value) -> Result<(), Error> {
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize") + "\n";
    std::fs::write(&path, text).map_err(io_err(&path))
}
