//! Trace mode (`replay --trace`): a recorded job replayed from its job model.
//! trace_input.rs turns each recorded GPU into a template for simulated GPUs and lays out
//! its files; trace_writes.rs repeats its write bursts after the steps they followed.

pub mod trace_input;
pub mod trace_writes;
