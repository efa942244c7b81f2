//! `trainer export --hf DIR`: a Hugging Face `config.json` and `model.safetensors`
//! that `transformers` loads with `from_pretrained`.

use std::collections::HashMap;
use std::path::Path;

use crds::presets::{Arch, ModelConfig};
use serde_json::{Value, json};
use tch::{Kind, Tensor};

use crate::{Error, io_err};

/// GPT-2's Conv1D layers store weights `(d_in, d_out)`; ours are `(d_out, d_in)`.
fn is_gpt2_conv1d(name: &str) -> bool {
    name.starts_with("transformer.h.")
        && name.ends_with(".weight")
        && [".attn.c_attn.", ".attn.c_proj.", ".mlp.c_fc.", ".mlp.c_proj."].iter().any(|l| name.contains(l))
}

/// The `config.json` of the matching `transformers` class.
pub fn hf_config(cfg: &ModelConfig, dtype: Kind) -> Result<Value, Error> {
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
                "bos_token_id": 0,
                "eos_token_id": 0,
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
                "bos_token_id": 0,
                "eos_token_id": 0,
                "torch_dtype": torch_dtype,
            })
        }
    })
}

/// Writes `dir/config.json` and `dir/model.safetensors` from the model's weights.
pub fn export_hf(cfg: &ModelConfig, weights: &HashMap<String, Tensor>, dir: &Path) -> Result<(), Error> {
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
    let config = serde_json::to_string_pretty(&hf_config(cfg, dtype)?).expect("config serializes");
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, config + "\n").map_err(io_err(&config_path))?;
    Tensor::write_safetensors(&tensors, dir.join("model.safetensors"))?;
    Ok(())
}
