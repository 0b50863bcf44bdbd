//! What the caller chooses: how processes are grouped into GPUs, the step gap, the data
//! device, and the what-ifs (whatif.rs).

/// How processes are grouped into GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Grouping {
    /// Ranks and their workers, found from the trace (module comment).
    #[default]
    Auto,
    /// Every process that reads is its own GPU.
    Process,
    /// These pids are the ranks; every other reader belongs to its nearest listed ancestor.
    Ranks(Vec<u32>),
}

impl Grouping {
    /// `auto`, `process`, or a comma-separated list of rank pids.
    pub fn parse(s: &str) -> Result<Grouping, String> {
        match s {
            "auto" => Ok(Grouping::Auto),
            "process" => Ok(Grouping::Process),
            _ => s
                .split(',')
                .map(|p| {
                    p.trim().parse::<u32>().map_err(|_| {
                        format!("--gpu-grouping: `{s}` is not auto, process, or a list of rank pids (e.g. 4242,4243)")
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Grouping::Ranks),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Options {
    pub grouping: Grouping,
    /// Step gap for bursts; None: found from the gaps.
    pub burst_gap_ms: Option<f64>,
    /// The data device (`MAJ:MIN`); None: the one most file-layer bytes were read from.
    pub dev: Option<String>,
    /// What-if: accelerators each recorded GPU (process) drives (whatif.rs); None: 1.
    pub gpus_per_process: Option<u32>,
    /// What-if: factor on the compute per step (whatif.rs); None: as recorded.
    pub compute_scale: Option<f64>,
}
