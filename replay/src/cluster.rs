//! The ranks of the job: MPI when started by mpirun, otherwise one rank on its own.
//!
//! MPI is initialized only when a launcher's environment is present (or TRAINIO_MPI=1):
//! a replay started by hand is one rank, and skipping OpenMPI's singleton start keeps it
//! from depending on a daemon it does not need. Every MPI call is wrapped here, so a
//! failure can name the rank and the call.
//!
//! Waiting uses nonblocking requests polled with short sleeps: OpenMPI's blocking calls
//! spin on a core, which would steal CPU from the readers of the same host. Every such
//! wait also asks the watchdog (watchdog.rs) whether a rank has gone silent: then the wait
//! ends with errors::PeerLost instead of lasting for ever, and `gather` collects what the
//! ranks still heard from have.
//!
//! cluster/watchdog.rs finds a lost host, which MPI alone never reports.

pub mod watchdog;

use crate::errors::PeerLost;
use mpi::collective::{CommunicatorCollectives, Root};
use mpi::point_to_point::{Destination, Source};
use mpi::request::Request;
use mpi::topology::{Communicator, SimpleCommunicator};
use std::sync::Arc;
use std::time::Duration;
use watchdog::{Lost, Watchdog};

/// The tag of the results the survivors of a lost rank send to rank 0.
const SURVIVORS_TAG: i32 = 0x7472;

pub struct Cluster {
    world: Option<(mpi::environment::Universe, SimpleCommunicator)>,
    pub rank: usize,
    pub size: usize,
    pub hostname: String,
    watchdog: Option<Watchdog>,
}

/// A step barrier that is in progress across ranks.
pub struct PendingBarrier(Option<Request<'static, ()>>, Option<Arc<watchdog::State>>);

impl PendingBarrier {
    /// True once every rank has arrived; PeerLost once a rank is known to be silent (the
    /// barrier is then abandoned: it cannot complete).
    pub fn poll(&mut self) -> Result<bool, PeerLost> {
        match self.0.take() {
            None => Ok(true),
            Some(req) => match req.test() {
                Ok(_) => Ok(true),
                Err(req) => match self.1.as_ref().and_then(|s| s.lost()) {
                    Some(lost) => {
                        // MPI still owns the request; dropping it would panic (rsmpi).
                        std::mem::forget(req);
                        Err(PeerLost(lost))
                    }
                    None => {
                        self.0 = Some(req);
                        Ok(false)
                    }
                },
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
        let timeout = watchdog::timeout_from_env().map_err(crate::errors::InputError)?;
        let hostname = hostname();
        let universe =
            mpi::initialize().ok_or_else(|| anyhow::anyhow!("MPI_Init failed (or MPI was already initialized)"))?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let mut cluster = Cluster { world: Some((universe, world)), rank, size, hostname, watchdog: None };
        if size > 1 {
            if let Some(timeout) = timeout {
                cluster.watchdog = cluster.start_watchdog(timeout);
            }
        }
        Ok(cluster)
    }

    /// One rank on its own, without MPI.
    pub fn alone() -> Cluster {
        Cluster { world: None, rank: 0, size: 1, hostname: hostname(), watchdog: None }
    }

    /// Every rank connects to rank 0 beside MPI (watchdog.rs). When a rank cannot, the
    /// watchdog is off on every rank (they agree through MPI), with a warning.
    fn start_watchdog(&self, timeout: Duration) -> Option<Watchdog> {
        let names = self.gather(self.hostname.clone().into_bytes()).map(|all| all.join(&b'\n')).unwrap_or_default();
        let hosts: Vec<String> =
            String::from_utf8_lossy(&self.broadcast(names)).split('\n').map(str::to_string).collect();
        // Ranks of one host cannot be cut off from each other, and mpirun ends a job whose
        // rank dies: the watchdog would only risk calling a starved rank lost.
        if hosts.iter().all(|h| *h == hosts[0]) {
            return None;
        }
        let hub = if self.is_root() { watchdog::listen().map_err(|e| e.to_string()) } else { Err(String::new()) };
        let hello = self.broadcast(match &hub {
            Ok(h) => h.hello.clone().into_bytes(),
            Err(_) => Vec::new(),
        });
        let peers = match &hub {
            Ok(h) => {
                let (peers, missing) = watchdog::accept(h, self.size);
                if !missing.is_empty() {
                    let which: Vec<String> =
                        missing.iter().map(|&r| format!("{r} on {}", hosts.get(r).map_or("?", |h| h))).collect();
                    Err(format!("rank(s) {} did not connect to rank 0", which.join(", ")))
                } else {
                    Ok(peers)
                }
            }
            Err(e) if self.is_root() => Err(format!("rank 0 cannot listen: {e}")),
            Err(_) => {
                let s = std::str::from_utf8(&hello).ok().and_then(|h| watchdog::connect(h, self.rank));
                s.map(|s| vec![(0, s)]).ok_or_else(String::new)
            }
        };
        let verdict = self.broadcast(match (&peers, self.is_root()) {
            (Ok(_), true) => b"on".to_vec(),
            (Err(e), true) => e.clone().into_bytes(),
            _ => Vec::new(),
        });
        if verdict != b"on" {
            if self.is_root() {
                eprintln!(
                    "trainio: warning: no watchdog for lost hosts: {} (it needs TCP from every host to rank 0's)",
                    String::from_utf8_lossy(&verdict)
                );
            }
            return None;
        }
        peers.ok().map(|p| watchdog::start(self.rank, p, hosts, timeout))
    }

    /// The ranks found silent, once the watchdog has found any.
    pub fn lost(&self) -> Option<Lost> {
        self.watchdog.as_ref().and_then(|w| w.lost())
    }

    /// The job ended normally: no rank is lost from here on (MPI_Finalize comes next).
    pub fn finish(&self) {
        if let Some(w) = &self.watchdog {
            w.disarm();
        }
    }

    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    fn comm(&self) -> Option<&SimpleCommunicator> {
        self.world.as_ref().map(|(_, w)| w)
    }

    pub fn start_barrier(&self) -> PendingBarrier {
        PendingBarrier(
            self.comm().filter(|_| self.size > 1).map(|w| w.immediate_barrier()),
            self.watchdog.as_ref().map(|w| w.state.clone()),
        )
    }

    /// A barrier that sleeps while it waits instead of spinning; PeerLost when a rank
    /// is silent.
    pub fn barrier(&self) -> Result<(), PeerLost> {
        let mut b = self.start_barrier();
        while !b.poll()? {
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// Gathers one byte string per rank on rank 0 (None on the other ranks). When ranks
    /// are lost (before or during the gather), rank 0 gathers from the others only, in
    /// rank order; a rank that has lost rank 0 sends nothing.
    pub fn gather(&self, mine: Vec<u8>) -> Option<Vec<Vec<u8>>> {
        let Some(world) = self.comm().filter(|_| self.size > 1) else {
            return Some(vec![mine]);
        };
        if let Err(PeerLost(lost)) = self.barrier() {
            return self.gather_survivors(world, mine, &lost);
        }
        self.blocking(|| {
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
        })
    }

    /// Runs a blocking MPI call, the watchdog told (watchdog::State::set_blocked).
    fn blocking<T>(&self, f: impl FnOnce() -> T) -> T {
        let state = self.watchdog.as_ref().map(|w| &w.state);
        state.inspect(|s| s.set_blocked(true));
        let out = f();
        state.inspect(|s| s.set_blocked(false));
        out
    }

    fn gather_survivors(&self, world: &SimpleCommunicator, mine: Vec<u8>, lost: &Lost) -> Option<Vec<Vec<u8>>> {
        if lost.ranks.contains(&0) {
            return None;
        }
        self.blocking(|| {
            if self.rank != 0 {
                world.process_at_rank(0).send_with_tag(&mine[..], SURVIVORS_TAG);
                return None;
            }
            let mut all = vec![mine];
            for r in (1..self.size).filter(|r| !lost.ranks.contains(r)) {
                let (msg, _) = world.process_at_rank(r as i32).receive_vec_with_tag::<u8>(SURVIVORS_TAG);
                all.push(msg);
            }
            Some(all)
        })
    }

    /// Rank 0's bytes, on every rank.
    pub fn broadcast(&self, mine: Vec<u8>) -> Vec<u8> {
        let Some(world) = self.comm().filter(|_| self.size > 1) else {
            return mine;
        };
        self.blocking(|| {
            let root = world.process_at_rank(0);
            let mut len = mine.len() as u64;
            root.broadcast_into(&mut len);
            if len == 0 {
                return Vec::new(); // MPI refuses a broadcast of an empty buffer
            }
            let mut buf = if self.rank == 0 { mine } else { vec![0u8; len as usize] };
            root.broadcast_into(&mut buf[..]);
            buf
        })
    }

    /// Ends the whole job: every rank, on every host. With a rank lost, this rank waits
    /// for the launcher to end it instead (watchdog.rs: MPI_Abort would wait for the lost
    /// host's daemon), and ends itself if it does not.
    pub fn abort(&self, code: i32) -> ! {
        if let (Some(w), Some(_)) = (&self.watchdog, self.lost()) {
            w.end_lost(code);
        }
        match self.comm().filter(|_| self.size > 1) {
            Some(w) => w.abort(code),
            None => std::process::exit(code),
        }
    }
}
