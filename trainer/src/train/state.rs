//! Each part of the trainer saves and restores its own piece of a checkpoint, as
//! torchtitan's `Stateful` does: the weights, the optimizer's state, the run's progress
//! and the data's position.

use tch::nn::VarStore;

use super::trainer::{DataCursor, Progress};
use crate::Error;
use crate::checkpoint::resume::{copy_weights, sorted_variables};
use crate::checkpoint::{Loaded, Payload};
use crate::optim::Optimizer;
use crate::parallel::DataParallel;

/// A part that keeps a piece of the checkpoint.
pub(super) trait Stateful {
    /// Writes this part's piece into `payload`. Every rank calls it: a sharded part
    /// gathers its whole piece.
    fn save(&mut self, payload: &mut Payload) -> Result<(), Error>;
    /// Takes this part's piece back from a loaded checkpoint.
    fn load(&mut self, loaded: &Loaded) -> Result<(), Error>;
}

/// The model's parameters: the variables, or fsdp's shards gathered whole.
pub(super) struct Weights<'a> {
    pub(super) vs: &'a VarStore,
    pub(super) parallel: &'a mut dyn DataParallel,
}

impl Weights<'_> {
    /// Every parameter whole, by name: copies gathered from every rank under fsdp
    /// (every rank calls this), the variables themselves otherwise.
    pub(super) fn whole(&mut self) -> Result<Vec<(String, tch::Tensor)>, Error> {
        match self.parallel.gathered_parameters()? {
            Some(whole) => Ok(whole),
            None => Ok(sorted_variables(self.vs)),
        }
    }
}

impl Stateful for Weights<'_> {
    fn save(&mut self, payload: &mut Payload) -> Result<(), Error> {
        payload.model = self.whole()?;
        Ok(())
    }

    fn load(&mut self, loaded: &Loaded) -> Result<(), Error> {
        copy_weights(self.vs, &loaded.model, &loaded.dir)
    }
}

impl Stateful for Optimizer {
    fn save(&mut self, payload: &mut Payload) -> Result<(), Error> {
        payload.optimizer = self.checkpoint_state()?;
        Ok(())
    }

    fn load(&mut self, loaded: &Loaded) -> Result<(), Error> {
        self.load_state(&loaded.optimizer)
    }
}

impl Stateful for Progress {
    fn save(&mut self, payload: &mut Payload) -> Result<(), Error> {
        let state = &mut payload.state;
        state.step = self.step;
        state.tokens = self.tokens;
        state.history = self.history.clone();
        Ok(())
    }

    fn load(&mut self, loaded: &Loaded) -> Result<(), Error> {
        let state = &loaded.state;
        self.step = state.step;
        self.tokens = state.tokens;
        self.resumed_from = Some(state.step);
        self.history = state.history.clone();
        Ok(())
    }
}

impl Stateful for DataCursor {
    fn save(&mut self, payload: &mut Payload) -> Result<(), Error> {
        payload.state.data_position = self.position;
        Ok(())
    }

    fn load(&mut self, loaded: &Loaded) -> Result<(), Error> {
        self.position = loaded.state.data_position;
        self.checkpoint_position = loaded.state.data_position;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{FORMAT_VERSION, TrainState};

    fn state() -> TrainState {
        serde_json::from_value(serde_json::json!({
            "formatVersion": FORMAT_VERSION, "step": 0, "tokens": 0, "dataPosition": 0, "rng": null,
            "configHash": "", "worldSize": 1, "attempt": 1, "preset": "tiny"
        }))
        .expect("a minimal state")
    }

    #[test]
    fn progress_and_the_data_position_come_back_as_they_were_saved() {
        let mut was = Progress { step: 12, tokens: 3072, ..Progress::default() };
        let mut cursor = DataCursor { position: 48, window: Some(40..48), checkpoint_position: 24 };
        let mut payload = Payload { model: Vec::new(), optimizer: Vec::new(), state: state() };
        was.save(&mut payload).unwrap();
        cursor.save(&mut payload).unwrap();
        let loaded = Loaded {
            dir: "step-00000012".into(),
            state: payload.state,
            model: Default::default(),
            optimizer: Default::default(),
        };
        let (mut now, mut at) = (Progress::default(), DataCursor::default());
        now.load(&loaded).unwrap();
        at.load(&loaded).unwrap();
        let seen = |p: &Progress| (p.step, p.tokens, p.history.len());
        assert_eq!(seen(&now), seen(&was));
        assert_eq!(now.resumed_from, Some(12), "a resume says where it started");
        assert_eq!((at.position, at.checkpoint_position), (48, 48), "a resume starts at its checkpoint's position");
        assert_eq!(at.window, None, "no step is in progress after a resume");
    }
}
