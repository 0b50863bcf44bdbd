//! The job's watchdog for lost hosts: a rank whose host's network is cut (or whose host is
//! down) answers no MPI call, and MPI waits for it for ever (OpenMPI's TCP gives up after
//! minutes). So the ranks keep a channel of their own beside MPI: every rank holds one TCP
//! connection to rank 0, and a thread on each end writes a heartbeat byte every tenth of
//! the timeout and notes when it last heard the other end. Heartbeats come from a thread
//! of their own, so a rank that is only slow (a long read, a checkpoint) is never silent.
//!
//! Rank 0 judges: when a rank has been silent for the timeout, every rank silent for more
//! than half of it is lost (the ranks of one cut host fall silent within a heartbeat of
//! each other), and rank 0 tells the others which ones. A rank that stops hearing rank 0
//! takes rank 0 as lost. Each rank then stops at its next MPI wait (the step barrier, any
//! barrier of cluster.rs), the survivors on rank 0's side send their results to rank 0
//! (cluster::Cluster::gather), and rank 0 saves them and names the lost host.
//!
//! A rank that knows of a lost peer never calls `MPI_Abort` nor `MPI_Finalize`: both wait
//! for every rank, through the launcher's daemon on the lost host. It waits instead for
//! the launcher to end it (mpirun does so once it sees that host's daemon gone; docs/hosts.md
//! has the ssh setting that makes that prompt), and ends itself, exit 2, twice the
//! timeout after the loss was seen if the launcher has not. A rank caught in a blocking
//! MPI call (a broadcast, a receive) when the loss is seen is ended the same way by the
//! watchdog's thread, two timeouts after both began.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The environment variable that sets the timeout, in seconds (0: no watchdog).
pub const ENV: &str = "TRAINIO_PEER_TIMEOUT";
pub const DEFAULT_TIMEOUT_S: f64 = 5.0;
/// How long rank 0 waits for every rank to connect at start-up.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// The timeout `TRAINIO_PEER_TIMEOUT` sets: None when it is 0 (no watchdog).
pub fn timeout_from_env() -> Result<Option<Duration>, String> {
    let v = match std::env::var(ENV) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => return Ok(Some(Duration::from_secs_f64(DEFAULT_TIMEOUT_S))),
    };
    match v.trim().parse::<f64>() {
        Ok(0.0) => Ok(None),
        Ok(s) if (0.5..=3600.0).contains(&s) => Ok(Some(Duration::from_secs_f64(s))),
        _ => Err(format!(
            "{ENV}={v}: give the seconds a silent rank is waited for, from 0.5 to 3600 (0 turns the watchdog off)"
        )),
    }
}

/// Ranks found silent, and their hosts.
#[derive(Debug, Clone, PartialEq)]
pub struct Lost {
    pub ranks: Vec<usize>,
    /// The host of each rank in `ranks` (from the start-up exchange).
    pub hosts: Vec<String>,
    /// The timeout they were silent for.
    pub timeout_s: f64,
}

impl Lost {
    /// "host h2 (ranks 2, 3) silent for 5 s (network cut or host down)"
    pub fn describe(&self) -> String {
        let mut by_host: Vec<(String, Vec<usize>)> = Vec::new();
        for (&r, h) in self.ranks.iter().zip(&self.hosts) {
            match by_host.iter_mut().find(|(x, _)| x == h) {
                Some((_, rs)) => rs.push(r),
                None => by_host.push((h.clone(), vec![r])),
            }
        }
        let parts: Vec<String> = by_host
            .iter()
            .map(|(h, rs)| {
                let list: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
                let word = if rs.len() == 1 { "rank" } else { "ranks" };
                format!("{h} ({word} {})", list.join(", "))
            })
            .collect();
        let hosts = if by_host.len() == 1 { "host" } else { "hosts" };
        format!(
            "{hosts} {} silent for {} s (network cut or host down; {ENV} sets the wait)",
            parts.join(", "),
            self.timeout_s
        )
    }

    pub fn to_json(&self) -> serde_json::Value {
        self.ranks.iter().zip(&self.hosts).map(|(r, h)| serde_json::json!({"rank": r, "host": h})).collect()
    }
}

#[derive(Default)]
pub struct State {
    lost: Mutex<Option<(Lost, Instant)>>,
    flagged: AtomicBool,
    disarmed: AtomicBool,
    /// Since when the main thread is in a blocking MPI call (cluster.rs), if it is.
    blocked: Mutex<Option<Instant>>,
}

impl State {
    pub fn lost(&self) -> Option<Lost> {
        if !self.flagged.load(Ordering::Acquire) {
            return None;
        }
        self.lost.lock().unwrap().as_ref().map(|(l, _)| l.clone())
    }

    /// The main thread enters (true) or leaves (false) a blocking MPI call: one that,
    /// with a rank lost, may never return, so the watchdog ends the process two timeouts
    /// after both the loss and the call began.
    pub fn set_blocked(&self, on: bool) {
        *self.blocked.lock().unwrap() = on.then(Instant::now);
    }

    /// Records the loss (the first one seen counts); true when it is new.
    fn flag(&self, lost: Lost) -> bool {
        let mut slot = self.lost.lock().unwrap();
        if slot.is_some() || self.disarmed.load(Ordering::Acquire) {
            return false;
        }
        *slot = Some((lost, Instant::now()));
        self.flagged.store(true, Ordering::Release);
        true
    }
}

/// This rank's end of the heartbeat channel; the thread runs until the process ends.
pub struct Watchdog {
    pub state: Arc<State>,
    pub timeout: Duration,
}

impl Watchdog {
    pub fn lost(&self) -> Option<Lost> {
        self.state.lost()
    }

    /// The job is ending normally (its results are gathered): a rank that exits from now
    /// on is not lost, and nothing ends this process any more.
    pub fn disarm(&self) {
        self.state.disarmed.store(true, Ordering::Release);
    }

    /// Waits to be ended by the launcher, then ends the process (see the module's doc).
    pub fn end_lost(&self, code: i32) -> ! {
        let since = self.state.lost.lock().unwrap().as_ref().map(|(_, t)| *t).unwrap_or_else(Instant::now);
        let until = since + 2 * self.timeout;
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        exit_now(code)
    }
}

fn exit_now(code: i32) -> ! {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process without running MPI's exit handlers, which would
    // wait for the lost ranks.
    unsafe { libc::_exit(code) }
}

/// Rank 0's side at start-up: the listener and what the other ranks need to reach it.
pub struct Hub {
    listener: TcpListener,
    key: u64,
    pub hello: String,
}

/// Rank 0: a listener on every address of this host; `hello` goes to the other ranks.
pub fn listen() -> std::io::Result<Hub> {
    let listener = TcpListener::bind(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0))
        .or_else(|_| TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)))?;
    let port = listener.local_addr()?.port();
    let key: u64 = rand::random();
    let addrs: Vec<String> = local_addresses().iter().map(|a| a.to_string()).collect();
    Ok(Hub { listener, key, hello: format!("{port} {key} {}", addrs.join(" ")) })
}

/// The addresses of this host's interfaces that are up, loopback last (it serves only
/// the ranks on rank 0's own host).
fn local_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills ifap with a list freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut ifap) } == 0 {
        let mut p = ifap;
        while !p.is_null() {
            // SAFETY: p is a node of the list getifaddrs returned.
            let ifa = unsafe { &*p };
            p = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
                continue;
            }
            // SAFETY: ifa_addr points to a sockaddr of the family it names.
            let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            let ip = match family {
                libc::AF_INET => {
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                    // Link-local addresses need a scope the other host cannot name.
                    if ip.segments()[0] & 0xffc0 == 0xfe80 {
                        continue;
                    }
                    IpAddr::V6(ip)
                }
                _ => continue,
            };
            if !ip.is_loopback() {
                out.push(ip);
            }
        }
        // SAFETY: ifap came from getifaddrs.
        unsafe { libc::freeifaddrs(ifap) };
    }
    out.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
    out
}

fn handshake_line(key: u64, rank: usize) -> String {
    format!("trainio-watchdog {key} {rank}\n")
}

fn read_line(s: &mut TcpStream, max: usize) -> Option<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < max {
        match s.read(&mut b) {
            Ok(1) if b[0] == b'\n' => return String::from_utf8(line).ok(),
            Ok(1) => line.push(b[0]),
            _ => return None,
        }
    }
    None
}

/// Rank 0: accepts the other `size - 1` ranks; the ranks that did not connect, if any.
pub fn accept(hub: &Hub, size: usize) -> (Vec<(usize, TcpStream)>, Vec<usize>) {
    let mut peers: Vec<(usize, TcpStream)> = Vec::new();
    let deadline = Instant::now() + CONNECT_WAIT;
    let _ = hub.listener.set_nonblocking(true);
    while peers.len() + 1 < size && Instant::now() < deadline {
        match hub.listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let rank = read_line(&mut s, 80).and_then(|l| {
                    let mut w = l.split(' ');
                    match (w.next(), w.next().and_then(|k| k.parse::<u64>().ok()), w.next()) {
                        (Some("trainio-watchdog"), Some(k), Some(r)) if k == hub.key => r.parse::<usize>().ok(),
                        _ => None,
                    }
                });
                let ours = rank.filter(|&r| r > 0 && r < size && !peers.iter().any(|(x, _)| *x == r));
                if let Some(r) = ours.filter(|_| s.write_all(b"ok\n").is_ok()) {
                    peers.push((r, s));
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    let missing = (1..size).filter(|r| !peers.iter().any(|(x, _)| x == r)).collect();
    (peers, missing)
}

/// A rank other than 0: connects to rank 0 with its `hello`, at the first address that
/// answers.
pub fn connect(hello: &str, rank: usize) -> Option<TcpStream> {
    let mut w = hello.split(' ');
    let port: u16 = w.next()?.parse().ok()?;
    let key: u64 = w.next()?.parse().ok()?;
    for a in w {
        let Ok(ip) = a.parse::<IpAddr>() else { continue };
        let Ok(mut s) = TcpStream::connect_timeout(&SocketAddr::new(ip, port), Duration::from_secs(1)) else {
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(handshake_line(key, rank).as_bytes()).is_ok() && read_line(&mut s, 8).as_deref() == Some("ok") {
            return Some(s);
        }
    }
    None
}

/// Starts the heartbeat thread of rank `rank`: rank 0 with a connection per other rank,
/// another rank with its connection to rank 0. `hosts[r]` is rank r's host.
pub fn start(rank: usize, peers: Vec<(usize, TcpStream)>, hosts: Vec<String>, timeout: Duration) -> Watchdog {
    let state = Arc::new(State::default());
    let st = state.clone();
    std::thread::Builder::new()
        .name("trainio-watchdog".into())
        .spawn(move || run(rank, peers, &hosts, timeout, &st))
        .expect("starting the watchdog thread");
    Watchdog { state, timeout }
}

struct Peer {
    rank: usize,
    stream: TcpStream,
    heard: Instant,
    /// Bytes of a stop message not yet ended by its newline.
    pending: Vec<u8>,
    open: bool,
}

fn run(rank: usize, peers: Vec<(usize, TcpStream)>, hosts: &[String], timeout: Duration, st: &State) {
    let interval = timeout / 10;
    let now = Instant::now();
    let mut peers: Vec<Peer> = peers
        .into_iter()
        .filter(|(_, s)| s.set_nonblocking(true).is_ok())
        .map(|(r, stream)| Peer { rank: r, stream, heard: now, pending: Vec::new(), open: true })
        .collect();
    let lost_of = |ranks: Vec<usize>| Lost {
        hosts: ranks.iter().map(|&r| hosts.get(r).cloned().unwrap_or_else(|| "?".into())).collect(),
        ranks,
        timeout_s: timeout.as_secs_f64(),
    };
    let mut buf = [0u8; 256];
    loop {
        std::thread::sleep(interval);
        let now = Instant::now();
        let mut told: Option<Vec<usize>> = None;
        for p in peers.iter_mut().filter(|p| p.open) {
            // A full send buffer (the peer is not reading) drops this beat: its silence
            // is what the other end measures.
            let _ = p.stream.write(b"H");
            loop {
                match p.stream.read(&mut buf) {
                    Ok(0) => {
                        p.open = false; // the peer's process ended: silent from now on
                        break;
                    }
                    Ok(n) => {
                        p.heard = now;
                        for &b in &buf[..n] {
                            match (b, p.pending.is_empty()) {
                                (b'S', true) => p.pending.push(b),
                                (b'\n', false) => {
                                    let msg = String::from_utf8_lossy(&p.pending[1..]).into_owned();
                                    told = Some(msg.split(',').filter_map(|r| r.parse().ok()).collect());
                                    p.pending.clear();
                                }
                                (_, false) => p.pending.push(b),
                                _ => {}
                            }
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => break, // WouldBlock: nothing more for now
                }
            }
        }
        if st.disarmed.load(Ordering::Acquire) {
            continue;
        }
        if st.flagged.load(Ordering::Acquire) {
            // The main thread stops on its own at its next barrier; only a blocking call
            // (a broadcast, a receive) would keep it.
            let lost_at = st.lost.lock().unwrap().as_ref().map(|(_, t)| *t);
            let blocked = *st.blocked.lock().unwrap();
            if let (Some(a), Some(b)) = (lost_at, blocked) {
                if now >= a.max(b) + 2 * timeout {
                    let lost = st.lost().map(|l| l.describe()).unwrap_or_default();
                    let host = hosts.get(rank).map_or("?", |h| h.as_str());
                    eprintln!("trainio: rank {rank} on {host} stopped in an MPI call: {lost}");
                    exit_now(2);
                }
            }
            continue;
        }
        if let Some(ranks) = told {
            st.flag(lost_of(ranks));
            continue;
        }
        let silent = |p: &Peer, limit: Duration| now.duration_since(p.heard) > limit;
        if !peers.iter().any(|p| silent(p, timeout)) {
            continue;
        }
        let mut ranks: Vec<usize> = peers.iter().filter(|p| silent(p, timeout / 2)).map(|p| p.rank).collect();
        ranks.sort_unstable();
        if st.flag(lost_of(ranks.clone())) && rank == 0 {
            let msg = format!("S{}\n", ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(","));
            for p in peers.iter_mut().filter(|p| !ranks.contains(&p.rank)) {
                let _ = p.stream.write_all(msg.as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_host_is_named_with_its_ranks() {
        let l = Lost { ranks: vec![2, 3], hosts: vec!["h2".into(), "h2".into()], timeout_s: 5.0 };
        assert!(l.describe().starts_with("host h2 (ranks 2, 3) silent for 5 s"), "{}", l.describe());
        let l = Lost { ranks: vec![0], hosts: vec!["h1".into()], timeout_s: 2.5 };
        assert!(l.describe().starts_with("host h1 (rank 0) silent for 2.5 s"), "{}", l.describe());
        let l = Lost { ranks: vec![1, 4], hosts: vec!["a".into(), "b".into()], timeout_s: 1.0 };
        assert!(l.describe().starts_with("hosts a (rank 1), b (rank 4) silent"), "{}", l.describe());
    }

    /// Two ends over loopback: while both beat, nothing is lost; once one end's thread
    /// is gone (its socket closed), the other names it within the timeout and a bit.
    #[test]
    fn a_silent_peer_is_found_within_the_timeout() {
        let hub = listen().unwrap();
        let hello = hub.hello.clone();
        let client = std::thread::spawn(move || connect(&hello, 1).expect("connects"));
        let (peers, missing) = accept(&hub, 2);
        assert!(missing.is_empty());
        let spoke = client.join().unwrap();
        let hosts = vec!["h0".to_string(), "h1".to_string()];
        let timeout = Duration::from_millis(600);
        let root = start(0, peers, hosts.clone(), timeout);
        // The other end beats by hand, as its thread would, for 3 timeouts.
        let mut s = spoke;
        let t0 = Instant::now();
        let mut stopped = t0;
        while t0.elapsed() < 3 * timeout {
            s.write_all(b"H").unwrap();
            stopped = Instant::now();
            std::thread::sleep(timeout / 10);
        }
        assert_eq!(root.lost(), None, "a beating peer is not lost");
        while root.lost().is_none() && stopped.elapsed() < 4 * timeout {
            std::thread::sleep(Duration::from_millis(10));
        }
        let found_after = stopped.elapsed();
        let lost = root.lost().expect("the silent peer is found");
        assert_eq!((lost.ranks, lost.hosts), (vec![1], vec!["h1".to_string()]));
        root.disarm(); // or the thread would end the test's process
        assert!(found_after >= timeout, "found before the timeout: {found_after:?}");
        drop(s);
    }
}
