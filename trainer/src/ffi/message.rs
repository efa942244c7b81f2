//! The shim's calling convention: every entry point returns NULL or a malloc'd
//! message, and tensors cross as `at::Tensor*`.

use std::ffi::{CStr, c_char};

use tch::Tensor;
use torch_sys::C_tensor;

use crate::Error;

unsafe extern "C" {
    fn shim_free_string(s: *mut c_char);
}

/// Turns the shim's return value (NULL or a malloc'd message) into a Result.
pub(crate) fn check(what: &str, err: *mut c_char) -> Result<(), Error> {
    match take_message(err) {
        None => Ok(()),
        Some(msg) => Err(Error::Shim(format!("{what}: {msg}"))),
    }
}

/// The shim's error message, if it returned one (freeing it).
pub(crate) fn take_message(err: *mut c_char) -> Option<String> {
    if err.is_null() {
        return None;
    }
    // SAFETY: a non-null return is a NUL-terminated string from strdup-like code in
    // the shim, owned by us until shim_free_string.
    let msg = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    unsafe { shim_free_string(err) };
    Some(msg)
}

pub(crate) fn ptrs(ts: &[Tensor]) -> Vec<*mut C_tensor> {
    ts.iter().map(|t| t.as_ptr() as *mut C_tensor).collect()
}
