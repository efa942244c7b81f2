//! fsdp's parameters as the model's [`Residency`]: a unit of the model is the unit of
//! [`ShardedParams`] at its [`Unit::backward_index`].

use std::cell::RefCell;

use crate::Error;
use crate::dist::fsdp::ShardedParams;
use crate::model::{Residency, Unit};

/// Fully sharded parameters, gathered a unit at a time for one pass of the model.
pub struct Sharded<'a> {
    params: RefCell<&'a mut ShardedParams>,
    n_layer: usize,
}

impl<'a> Sharded<'a> {
    pub fn new(params: &'a mut ShardedParams, n_layer: usize) -> Sharded<'a> {
        Sharded { params: RefCell::new(params), n_layer }
    }
}

impl Residency for Sharded<'_> {
    fn gather(&self, unit: Unit) -> Result<(), Error> {
        self.params.borrow_mut().gather(unit.backward_index(self.n_layer))
    }
    fn prefetch(&self, unit: Unit) -> Result<(), Error> {
        self.params.borrow_mut().prefetch(unit.backward_index(self.n_layer))
    }
    fn release(&self, unit: Unit) -> Result<(), Error> {
        self.params.borrow_mut().release(unit.backward_index(self.n_layer))
    }
}
