//! The ranks of the job: MPI when started by mpirun, otherwise one rank on its own.
//!
//! MPI is initialized only when a launcher's environment is present (or TRAINIO_MPI=1):
//! a replay started by hand is one rank, and skipping OpenMPI's singleton start keeps it
//! from depending on a daemon it does not need. Every MPI call is wrapped here, so a
//! failure can name the rank and the call.
//!
//! Waiting uses nonblocking requests polled with short sleeps: OpenMPI's blocking calls
//! spin on a core, which would steal CPU from the readers of the same host.

use mpi::collective::{CommunicatorCollectives, Root};
use mpi::point_to_point::{Destination, Source};
use mpi::request::Request;
use mpi::topology::{Communicator, SimpleCommunicator};
use std::time::Duration;

pub struct Cluster {
    world: Option<(mpi::environment::Universe, SimpleCommunicator)>,
    pub rank: usize,
    pub size: usize,
    pub hostname: String,
}

/// A step barrier that is in progress across ranks.
pub struct PendingBarrier(Option<Request<'static, ()>>);

impl PendingBarrier {
    /// True once every rank has arrived.
    pub fn done(&mut self) -> bool {
        match self.0.take() {
            None => true,
            Some(req) => match req.test() {
                Ok(_) => true,
                Err(req) => {
                    self.0 = Some(req);
                    false
                }
            },
        }
    }
}

fn launched_by_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"].iter().any(|k| std::env::var_os(k).is_some())
        || std::env::var("TRAINIO_MPI").map(|v| v == "1").unwrap_or(false)
}

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl Cluster {
    pub fn init() -> anyhow::Result<Cluster> {
        if !launched_by_mpirun() {
            return Ok(Cluster::alone());
        }
        let hostname = hostname();
        let universe =
            mpi::initialize().ok_or_else(|| anyhow::anyhow!("MPI_Init failed (or MPI was already initialized)"))?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        Ok(Cluster { world: Some((universe, world)), rank, size, hostname })
    }

    /// One rank on its own, without MPI.
    pub fn alone() -> Cluster {
        Cluster { world: None, rank: 0, size: 1, hostname: hostname() }
    }

    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    fn comm(&self) -> Option<&SimpleCommunicator> {
        self.world.as_ref().map(|(_, w)| w)
    }

    pub fn start_barrier(&self) -> PendingBarrier {
        PendingBarrier(self.comm().filter(|_| self.size > 1).map(|w| w.immediate_barrier()))
    }

    /// A barrier that sleeps while it waits instead of spinning.
    pub fn barrier(&self) {
        let mut b = self.start_barrier();
        while !b.done() {
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Gathers one byte string per rank on rank 0 (None on the other ranks).
    pub fn gather(&self, mine: Vec<u8>) -> Option<Vec<Vec<u8>>> {
        let Some(world) = self.comm().filter(|_| self.size > 1) else {
            return Some(vec![mine]);
        };
        self.barrier();
        if self.rank == 0 {
            let mut all = vec![mine];
            for r in 1..self.size {
                let (msg, _) = world.process_at_rank(r as i32).receive_vec::<u8>();
                all.push(msg);
            }
            Some(all)
        } else {
            world.process_at_rank(0).send(&mine[..]);
            None
        }
    }

    /// Rank 0's bytes, on every rank.
    pub fn broadcast(&self, mine: Vec<u8>) -> Vec<u8> {
        let Some(world) = self.comm().filter(|_| self.size > 1) else {
            return mine;
        };
        let root = world.process_at_rank(0);
        let mut len = mine.len() as u64;
        root.broadcast_into(&mut len);
        if len == 0 {
            return Vec::new(); // MPI refuses a broadcast of an empty buffer
        }
        let mut buf = if self.rank == 0 { mine } else { vec![0u8; len as usize] };
        root.broadcast_into(&mut buf[..]);
        buf
    }

    /// Ends the whole job: every rank, on every host.
    pub fn abort(&self, code: i32) -> ! {
        match self.comm().filter(|_| self.size > 1) {
            Some(w) => w.abort(code),
            None => std::process::exit(code),
        }
    }
}
