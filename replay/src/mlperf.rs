//! MLPerf Storage's rules, as a replay checks and reports them: edition.rs (the v3.0
//! edition's models, accelerators, AU thresholds and the keys a CLOSED or OPEN run may
//! change), datasize.rs (the dataset-size rule) and runrules.rs (the rules over --runs N).

pub mod datasize;
pub mod edition;
pub mod runrules;
