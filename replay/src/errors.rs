//! The error kind every command reports as bad input: one line, exit status 2 (main.rs).
//! A leaf module, so that any module can raise it without depending on another.

/// An error in what the user gave us (file, flags): reported in one line, exit 2.
#[derive(Debug)]
pub struct InputError(pub String);
impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for InputError {}

/// A checkpoint that failed on some rank (its file system full, most often). Every rank
/// learns it at the same step (checkpointing::Checkpointer::timed), so the job stops
/// there together and keeps the results of the steps it ran.
#[derive(Debug)]
pub struct CheckpointFailed(pub String);
impl std::fmt::Display for CheckpointFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for CheckpointFailed {}
