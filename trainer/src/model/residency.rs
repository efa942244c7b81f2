//! Where a model's parameters live between uses. Whole on every rank by default
//! ([`Resident`]); fully sharded data parallelism gathers a unit's parameters just
//! before it runs and frees them after, so the model's passes say when each unit
//! starts and ends ([`Residency`]).

use crate::Error;

/// A group of parameters gathered and freed together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// The token embedding (and GPT-2's positions); the head reads it too when tied.
    Embedding,
    Block(usize),
    /// The final norm and an untied lm_head.
    Head,
}

impl Unit {
    /// The unit that owns the parameter named `name` (its HF path).
    pub fn of(name: &str) -> Unit {
        let parts: Vec<&str> = name.split('.').collect();
        for pair in parts.windows(2) {
            if matches!(pair[0], "layers" | "h")
                && let Ok(i) = pair[1].parse()
            {
                return Unit::Block(i);
            }
        }
        if parts.iter().any(|p| matches!(*p, "embed_tokens" | "wte" | "wpe")) { Unit::Embedding } else { Unit::Head }
    }

    /// Position in the order backward produces gradients: the head, the blocks from
    /// the last, the embedding.
    pub fn backward_index(self, n_layer: usize) -> usize {
        match self {
            Unit::Head => 0,
            Unit::Block(i) => n_layer - i,
            Unit::Embedding => n_layer + 1,
        }
    }
}

/// Makes a unit's parameters present before it runs and lets them go after. Every
/// rank makes the same calls in the same order (gathering is a collective).
pub trait Residency {
    /// The unit's parameters are whole until [`Residency::release`].
    fn gather(&self, unit: Unit) -> Result<(), Error>;
    /// Starts gathering a unit that will be needed next, without waiting.
    fn prefetch(&self, unit: Unit) -> Result<(), Error>;
    fn release(&self, unit: Unit) -> Result<(), Error>;
    /// Whether the parameters are always whole (nothing to gather).
    fn resident(&self) -> bool {
        false
    }
}

/// Parameters that are always whole.
pub struct Resident;

impl Residency for Resident {
    fn gather(&self, _: Unit) -> Result<(), Error> {
        Ok(())
    }
    fn prefetch(&self, _: Unit) -> Result<(), Error> {
        Ok(())
    }
    fn release(&self, _: Unit) -> Result<(), Error> {
        Ok(())
    }
    fn resident(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::Unit;

    #[test]
    fn parameters_belong_to_their_units_and_units_to_the_backward_order() {
        for (name, unit) in [
            ("model.embed_tokens.weight", Unit::Embedding),
            ("model.layers.0.self_attn.q_proj.weight", Unit::Block(0)),
            ("model.layers.11.mlp.down_proj.weight", Unit::Block(11)),
            ("model.norm.weight", Unit::Head),
            ("lm_head.weight", Unit::Head),
            ("transformer.wte.weight", Unit::Embedding),
            ("transformer.wpe.weight", Unit::Embedding),
            ("transformer.h.3.attn.c_attn.bias", Unit::Block(3)),
            ("transformer.ln_f.bias", Unit::Head),
        ] {
            assert_eq!(Unit::of(name), unit, "{name}");
        }
        let order: Vec<usize> = [Unit::Head, Unit::Block(2), Unit::Block(1), Unit::Block(0), Unit::Embedding]
            .iter()
            .map(|u| u.backward_index(3))
            .collect();
        assert_eq!(order, [0, 1, 2, 3, 4]);
    }
}
