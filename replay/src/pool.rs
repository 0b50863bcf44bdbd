//! The `psync` I/O engine: one OS thread per reader slot, each doing blocking `pread`,
//! like fio's psync engine or a DataLoader worker process. The event loop stays the same:
//! a thread posts its result to a shared list and bumps an eventfd that the loop reads
//! through io_uring. Use it when the reads must be syscalls (the file-layer recorder
//! sees read syscalls, not io_uring requests); io_uring remains the default because it
//! needs no thread per outstanding read.

use anyhow::{bail, Result};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

struct Job {
    fd: i32,
    buf: usize,
    len: usize,
    offset: u64,
}

pub struct ReadPool {
    senders: Vec<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    done: Arc<Mutex<Vec<(u64, i32)>>>,
    pub eventfd: i32,
}

impl ReadPool {
    pub fn new(slots: usize) -> Result<ReadPool> {
        let eventfd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if eventfd < 0 {
            bail!("eventfd: {}", std::io::Error::last_os_error());
        }
        let done = Arc::new(Mutex::new(Vec::new()));
        let mut senders = Vec::with_capacity(slots);
        let mut threads = Vec::with_capacity(slots);
        for w in 0..slots {
            let (tx, rx) = channel::<Job>();
            let done = done.clone();
            let handle = std::thread::Builder::new()
                .name(format!("reader-{w}"))
                .stack_size(64 << 10)
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        let n = unsafe {
                            libc::pread(job.fd, job.buf as *mut libc::c_void, job.len, job.offset as libc::off_t)
                        };
                        let res = if n < 0 {
                            -std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
                        } else {
                            n as i32
                        };
                        done.lock().unwrap().push((w as u64, res));
                        let one: u64 = 1;
                        unsafe { libc::write(eventfd, &one as *const u64 as *const libc::c_void, 8) };
                    }
                })
                .map_err(|e| anyhow::anyhow!("starting reader thread {w}: {e}"))?;
            senders.push(tx);
            threads.push(handle);
        }
        Ok(ReadPool { senders, threads, done, eventfd })
    }

    /// Reader slot `w` reads `len` bytes at `offset` of `fd` into `buf`.
    pub fn submit(&self, w: usize, fd: i32, buf: *mut u8, len: usize, offset: u64) {
        // The slot's thread is idle: a worker has at most one read in flight.
        let _ = self.senders[w].send(Job { fd, buf: buf as usize, len, offset });
    }

    /// Moves the finished reads (slot, result) into `out`.
    pub fn drain(&self, out: &mut Vec<(u64, i32)>) {
        out.append(&mut self.done.lock().unwrap());
    }
}

impl Drop for ReadPool {
    fn drop(&mut self) {
        self.senders.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        unsafe { libc::close(self.eventfd) };
    }
}
