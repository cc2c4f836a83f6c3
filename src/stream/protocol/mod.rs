//! The stream protocol's frames and the osiris chunks Deliver carries.

pub(crate) mod chunk;
pub(crate) mod frame;
