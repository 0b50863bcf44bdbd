//! The error kind every command reports as bad input: one line, exit status 2 (main.rs).
//! A leaf module (but for watchdog::Lost, itself a leaf), so that any module can raise these
//! without depending on another.

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

/// Ranks that went silent (their host's network cut, or the host down), found by the
/// watchdog (watchdog.rs): the MPI wait that met it ends with this instead of lasting.
#[derive(Debug)]
pub struct PeerLost(pub crate::cluster::watchdog::Lost);
impl std::fmt::Display for PeerLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.describe())
    }
}
impl std::error::Error for PeerLost {}
