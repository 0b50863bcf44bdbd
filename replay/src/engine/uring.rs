//! The replay's I/O backend: data files opened beneath the data directory, one read per
//! reader slot in flight, submitted to io_uring (or, with `--io-engine psync`, handed to a
//! thread per slot doing blocking `pread`), and one wait in `io_uring_enter` for the next
//! completion or the state machine's next deadline.
//!
//! The GPU/loader state machine (engine.rs) decides what is read when; this module only
//! carries the reads out and keeps the clock.

use crate::engine::{Backend, Engine, EngineOptions, Program};
use anyhow::{bail, Context, Result};
use io_uring::{opcode, types, IoUring};
use std::path::Path;
use std::time::Instant;

/// user_data of the psync engine's eventfd read.
const EVENTFD_TAG: u64 = u64::MAX;

/// All read buffers of a rank in one anonymous mapping, 2 MiB-aligned and advised for
/// transparent huge pages, and registered with io_uring when the kernel allows it: an
/// O_DIRECT read then neither pins 256 small pages per MiB (get_user_pages) nor marks
/// them dirty one by one, which cost a third of the CPU of a 1 MiB read without it.
///
/// The advice covers whole huge pages, past the last buffer's end: a buffer (a slot's
/// 1 MiB + 4 KiB) whose tail lay in small pages would be registered page by page, and
/// its read would reach the block layer as one segment per 4 KiB page, split into
/// several requests by a device's segment limit (a loop device's 128 segments: two
/// 512 KiB requests for a 1 MiB read) where every other slot's read is one request.
struct BufferArena {
    map: *mut libc::c_void,
    map_len: usize,
    base: *mut u8,
}

const HUGE: usize = 2 << 20;

impl BufferArena {
    fn new(len: usize) -> Result<BufferArena> {
        let len = len.div_ceil(HUGE) * HUGE;
        let map_len = len + HUGE;
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            bail!("allocating {} MiB of read buffers: {}", len >> 20, std::io::Error::last_os_error());
        }
        let base = ((map as usize).div_ceil(HUGE) * HUGE) as *mut u8;
        unsafe {
            libc::madvise(base as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            // Touch now so no read measures a page fault.
            std::ptr::write_bytes(base, 0, len);
        }
        Ok(BufferArena { map, map_len, base })
    }
}

impl Drop for BufferArena {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

pub struct Uring {
    ring: IoUring,
    /// Read buffers; kept alive for the slots' raw pointers.
    _arena: BufferArena,
    /// Per reader slot, its buffer of `buf_len` bytes.
    bufs: Vec<*mut u8>,
    buf_len: usize,
    /// Buffers are registered with io_uring: reads use ReadFixed with the slot's index.
    fixed_buffers: bool,
    odirect: bool,
    realtime: bool,
    psync: bool,
    /// psync engine: the reader threads, and the buffer the eventfd is read into.
    pool: Option<crate::engine::pool::ReadPool>,
    eventfd_buf: Box<u64>,
    pool_done: Vec<(u64, i32)>,
    /// Opens the data files beneath the data directory, never through a link.
    beneath: crate::beneath::Beneath,
    t0: Instant,
}

impl Uring {
    /// `slots` reader slots with a buffer of `buf_len` bytes each; files opened beneath `root`.
    pub fn new(slots: usize, buf_len: usize, root: &Path, options: &EngineOptions) -> Result<Uring> {
        let entries = ((slots + 1).max(8) as u32).next_power_of_two().min(32768);
        let ring =
            IoUring::new(entries).context("setting up io_uring (is it disabled by kernel.io_uring_disabled?)")?;
        let arena = BufferArena::new(buf_len * slots.max(1))?;
        let bufs: Vec<*mut u8> = (0..slots).map(|i| unsafe { arena.base.add(i * buf_len) }).collect();
        // Registration pins the buffers once; without it (old kernel, >16k buffers, a
        // memlock limit) reads fall back to plain IORING_OP_READ.
        let iovecs: Vec<libc::iovec> =
            bufs.iter().map(|&b| libc::iovec { iov_base: b as *mut libc::c_void, iov_len: buf_len }).collect();
        let fixed_buffers = slots <= 16384 && unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        Ok(Uring {
            ring,
            _arena: arena,
            bufs,
            buf_len,
            fixed_buffers,
            odirect: options.odirect,
            realtime: options.realtime,
            psync: options.psync,
            pool: None,
            eventfd_buf: Box::new(0),
            pool_done: Vec::new(),
            beneath: crate::beneath::Beneath::new(root)?,
            t0: Instant::now(),
        })
    }

    /// Queues one SQE, submitting first if the submission queue is full.
    ///
    /// # Safety
    /// The buffers the SQE points to must stay valid until its completion is reaped.
    unsafe fn push_sqe(&mut self, sqe: &io_uring::squeue::Entry) -> Result<()> {
        if self.ring.submission().push(sqe).is_err() {
            self.ring.submit().context("io_uring_enter")?;
            self.ring.submission().push(sqe).map_err(|_| anyhow::anyhow!("io_uring submission queue full"))?;
        }
        Ok(())
    }

    /// psync: one read of the eventfd in flight at all times (not a reader slot's read).
    fn arm_eventfd(&mut self) -> Result<()> {
        let fd = self.pool.as_ref().unwrap().eventfd;
        let sqe = opcode::Read::new(types::Fd(fd), &mut *self.eventfd_buf as *mut u64 as *mut u8, 8)
            .build()
            .user_data(EVENTFD_TAG);
        // SAFETY: eventfd_buf lives as long as the backend.
        unsafe { self.push_sqe(&sqe)? };
        Ok(())
    }
}

impl Backend for Uring {
    fn start(&mut self) -> Result<()> {
        // The default 50 µs timer slack would be added to every compute sleep.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
        if self.realtime {
            // Priority 1: above every normal task, below the kernel's own real-time threads.
            // The loop blocks in io_uring_enter, so it cannot starve the host.
            let param = libc::sched_param { sched_priority: 1 };
            if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
                let e = std::io::Error::last_os_error();
                bail!("--realtime: sched_setscheduler(SCHED_FIFO): {e} (needs root or CAP_SYS_NICE)");
            }
        }
        self.t0 = Instant::now();
        if self.psync {
            self.pool = Some(crate::engine::pool::ReadPool::new(self.bufs.len())?);
            self.arm_eventfd()?;
        }
        Ok(())
    }

    fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    fn buf_len(&self) -> u64 {
        self.buf_len as u64
    }

    fn open(&mut self, path: &Path) -> Result<i32> {
        let flags = libc::O_RDONLY | if self.odirect { libc::O_DIRECT } else { 0 };
        Ok(std::os::fd::IntoRawFd::into_raw_fd(self.beneath.open(path, flags, 0)?))
    }

    fn close(&mut self, fd: i32) {
        unsafe { libc::close(fd) };
    }

    fn submit(&mut self, slot: usize, fd: i32, offset: u64, len: u32) -> Result<()> {
        let buf = self.bufs[slot];
        if let Some(pool) = &self.pool {
            pool.submit(slot, fd, buf, len as usize, offset);
            return Ok(());
        }
        let sqe = if self.fixed_buffers {
            opcode::ReadFixed::new(types::Fd(fd), buf, len, slot as u16).offset(offset).build()
        } else {
            opcode::Read::new(types::Fd(fd), buf, len).offset(offset).build()
        }
        .user_data(slot as u64);
        // SAFETY: the buffer belongs to the slot, which has no other read in flight.
        unsafe { self.push_sqe(&sqe) }
    }

    fn submit_mapped(&mut self, slot: usize, fd: i32, offset: u64, len: u32) -> Result<()> {
        // Page faults are no io_uring request: a pool thread takes them, with io_uring too.
        if self.pool.is_none() {
            self.pool = Some(crate::engine::pool::ReadPool::new(self.bufs.len())?);
            self.arm_eventfd()?;
        }
        self.pool.as_ref().unwrap().submit_mapped(slot, fd, len as usize, offset);
        Ok(())
    }

    fn wait(&mut self, wait_ns: u64, out: &mut Vec<(usize, i32)>) -> Result<()> {
        if wait_ns > 0 {
            let ts = types::Timespec::new()
                .sec(wait_ns.min(3_600_000_000_000) / 1_000_000_000)
                .nsec((wait_ns % 1_000_000_000) as u32);
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ETIME) || e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e).context("io_uring_enter"),
            }
        } else {
            self.ring.submit().context("io_uring_enter")?;
        }
        let mut eventfd = false;
        for c in self.ring.completion() {
            if c.user_data() == EVENTFD_TAG {
                eventfd = true;
            } else {
                out.push((c.user_data() as usize, c.result()));
            }
        }
        if eventfd {
            // psync: the eventfd fired; the finished reads wait in the pool's list.
            self.pool_done.clear();
            self.pool.as_ref().unwrap().drain(&mut self.pool_done);
            out.extend(self.pool_done.iter().map(|&(w, res)| (w as usize, res)));
            self.arm_eventfd()?;
        }
        Ok(())
    }
}

impl<'a, P: Program> Engine<'a, P, Uring> {
    /// The engine over io_uring (or psync threads): `gpus` are the global indices of this
    /// rank's simulated GPUs; `seed` makes compute draws repeatable.
    pub fn new(
        program: &'a P,
        gpus: &[u64],
        rank: usize,
        cluster: &'a crate::cluster::Cluster,
        options: EngineOptions,
        seed: u64,
    ) -> Result<Self> {
        let slots = (0..gpus.len()).map(|g| program.read_threads(g).max(1)).sum();
        let backend = Uring::new(slots, crate::engine::buffer_len(program), program.root(), &options)?;
        Engine::with_backend(program, gpus, rank, cluster, options, seed, backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The [start, end) of the mapping of this process that holds `addr`, and whether it
    /// is advised for huge pages (`hg` in its VmFlags), from /proc/self/smaps.
    fn vma_of(addr: usize) -> (usize, usize, bool) {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut found: Option<(usize, usize)> = None;
        for line in smaps.lines() {
            // A mapping's first line starts with its range, `start-end` in hex.
            let head = line.split_whitespace().next().unwrap_or("");
            let range = head
                .split_once('-')
                .and_then(|(a, b)| Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?)));
            if let Some((a, b)) = range {
                found = (a <= addr && addr < b).then_some((a, b));
                continue;
            }
            if let (Some((a, b)), Some(flags)) = (found, line.strip_prefix("VmFlags:")) {
                return (a, b, flags.split_whitespace().any(|f| f == "hg"));
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn every_buffer_lies_in_whole_huge_pages() {
        // Four slots of 1 MiB + 4 KiB, as a rank with 4 readers of 1 MiB requests has:
        // the last one ends 16 KiB past the second huge page.
        let slot = (1 << 20) + 4096;
        let arena = BufferArena::new(4 * slot).unwrap();
        let base = arena.base as usize;
        assert_eq!(base % HUGE, 0);
        let end = base + 4 * slot;
        let (start, vma_end, advised) = vma_of(end - 1);
        assert!(advised, "the last buffer's tail is not advised for huge pages");
        assert!(start <= base, "one advised mapping holds every buffer");
        assert!(
            vma_end >= end.div_ceil(HUGE) * HUGE,
            "the advice ends inside a huge page: {vma_end:#x} < {end:#x} rounded up"
        );
    }
}
