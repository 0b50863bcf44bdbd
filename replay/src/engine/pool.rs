//! The `psync` I/O engine: one OS thread per reader slot, each doing blocking `pread`,
//! like fio's psync engine or a DataLoader worker process. The event loop stays the same:
//! a thread posts its result to a shared list and bumps an eventfd that the loop reads
//! through io_uring. Use it when the reads must be syscalls (the file-layer recorder
//! sees read syscalls, not io_uring requests); io_uring remains the default because it
//! needs no thread per outstanding read. A trace's reads through mmap are replayed by
//! these threads whatever the engine: a page fault is no io_uring request.

use anyhow::{bail, Result};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

struct Job {
    fd: i32,
    buf: usize,
    len: usize,
    offset: u64,
    /// Read through a mapping (touch_mapped) rather than pread.
    mapped: bool,
}

const PAGE: u64 = 4096;

/// Maps [offset, offset + len) of fd read-only and touches the first byte of each of its
/// pages in order, as a job reading through mmap faults them in; returns len or -errno.
/// The mapping is of the range alone, so fault-around stays within it.
pub(crate) fn touch_mapped(fd: i32, offset: u64, len: usize) -> i32 {
    let start = offset / PAGE * PAGE;
    let span = (offset + len as u64 - start) as usize;
    // SAFETY: a fresh read-only mapping, read within its bounds and unmapped here.
    unsafe {
        let at = libc::mmap(std::ptr::null_mut(), span, libc::PROT_READ, libc::MAP_SHARED, fd, start as libc::off_t);
        if at == libc::MAP_FAILED {
            return -std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        }
        let base = at as *const u8;
        let mut sum = 0u8;
        let mut p = (offset - start) as usize / PAGE as usize * PAGE as usize;
        while p < span {
            sum = sum.wrapping_add(std::ptr::read_volatile(base.add(p)));
            p += PAGE as usize;
        }
        std::hint::black_box(sum);
        libc::munmap(at, span);
    }
    len as i32
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
                        let res = if job.mapped {
                            touch_mapped(job.fd, job.offset, job.len)
                        } else {
                            let n = unsafe {
                                libc::pread(job.fd, job.buf as *mut libc::c_void, job.len, job.offset as libc::off_t)
                            };
                            if n < 0 {
                                -std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
                            } else {
                                n as i32
                            }
                        };
                        done.lock().unwrap().push((w as u64, res));
                        let one: u64 = 1;
                        unsafe { libc::write(eventfd, &one as *const u64 as *const libc::c_void, 8) };
                    }
                    crate::engine::client::add_io_thread();
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
        let _ = self.senders[w].send(Job { fd, buf: buf as usize, len, offset, mapped: false });
    }

    /// Reader slot `w` touches the pages of `len` bytes at `offset` of `fd` through a
    /// mapping (touch_mapped).
    pub fn submit_mapped(&self, w: usize, fd: i32, len: usize, offset: u64) {
        let _ = self.senders[w].send(Job { fd, buf: 0, len, offset, mapped: true });
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
