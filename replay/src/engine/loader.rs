//! The data loader of each simulated GPU: its workers start batches while the prefetch
//! window allows, read them sample after sample (through the backend, or recorded reads
//! in their recorded order and pace), and hand them to the GPU in step order.

use super::{stream_of, Backend, Engine, Program, SampleRead, Slot, State, ALIGN};
use anyhow::{bail, Result};
use std::cmp::Reverse;

impl<'a, P: Program, B: Backend> Engine<'a, P, B> {
    /// Starts batches on idle workers of GPU `g` while the prefetch window allows.
    pub(super) fn fill(&mut self, g: usize) -> Result<()> {
        if self.recorded {
            return self.fill_recorded(g);
        }
        let end = self.program.steps_per_epoch() + self.program.untaken_batches(g, self.gpus[g].epoch);
        for k in 0..self.gpus[g].workers.len() {
            let w = self.gpus[g].workers[k];
            let gpu = &self.gpus[g];
            if self.workers[w].step.is_some() || gpu.state == State::Done {
                continue;
            }
            if gpu.next_to_start >= end || gpu.next_to_start >= gpu.consumed + gpu.window {
                break;
            }
            let step = gpu.next_to_start;
            let batch = self.program.batch(g, gpu.epoch, step);
            let gpu = &mut self.gpus[g];
            gpu.next_to_start += 1;
            gpu.slots.push_back(Slot { step, batch, done: false, unassigned: 0, outstanding: 0, cursor: Vec::new() });
            let worker = &mut self.workers[w];
            worker.step = Some(step);
            worker.item = 0;
            worker.pos = 0;
            self.start_item(w)?;
        }
        Ok(())
    }

    /// Recorded mode: every idle worker takes its next read (by `Batch::streams`) from the
    /// oldest batch in the window that has one, starting new batches while the window
    /// allows. Once the GPU is done, a worker only finishes the batch it has started
    /// (`Program::untaken_batches`).
    fn fill_recorded(&mut self, g: usize) -> Result<()> {
        let end = self.program.steps_per_epoch() + self.program.untaken_batches(g, self.gpus[g].epoch);
        let nw = self.gpus[g].workers.len();
        let now = self.now();
        let sync = self.program.synchronous(g);
        let done = self.gpus[g].state == State::Done;
        let mut finished_empty = false;
        for k in 0..nw {
            let w = self.gpus[g].workers[k];
            if self.workers[w].step.is_some() {
                continue;
            }
            let mut si = 0usize;
            let assigned = loop {
                let gpu = &mut self.gpus[g];
                if si < gpu.slots.len() {
                    let slot = &mut gpu.slots[si];
                    si += 1;
                    // A batch this worker has not started (its cursor at 0) waits for
                    // it, unless the loader is shut down.
                    if slot.unassigned == 0 || (done && slot.cursor[k] == 0) {
                        continue;
                    }
                    let n = slot.batch.reads.len();
                    let streams = &slot.batch.streams;
                    let mut i = slot.cursor[k];
                    while i < n && stream_of(streams, i) % nw != k {
                        i += 1;
                    }
                    slot.cursor[k] = (i + 1).min(n);
                    if i < n {
                        slot.unassigned -= 1;
                        slot.outstanding += 1;
                        break Some((slot.step, i));
                    }
                    continue;
                }
                if done || gpu.next_to_start >= end || gpu.next_to_start >= gpu.consumed + gpu.window {
                    break None;
                }
                if sync && (gpu.next_to_start > gpu.step || !matches!(gpu.state, State::WaitBatch { .. })) {
                    break None;
                }
                let step = gpu.next_to_start;
                if let Some(at) = self.program.not_before_ns(g, gpu.epoch, step) {
                    let at = gpu.epoch_start + at;
                    if at > now {
                        if !gpu.pace_pending {
                            gpu.pace_pending = true;
                            self.pace_timers.push(Reverse((at, g)));
                        }
                        break None;
                    }
                }
                let batch = self.program.batch(g, gpu.epoch, step);
                let gpu = &mut self.gpus[g];
                gpu.next_to_start += 1;
                let n = batch.reads.len();
                finished_empty |= n == 0;
                gpu.slots.push_back(Slot {
                    step,
                    batch,
                    done: n == 0,
                    unassigned: n,
                    outstanding: 0,
                    cursor: vec![0; nw],
                });
            };
            let Some((step, item)) = assigned else {
                continue;
            };
            let worker = &mut self.workers[w];
            worker.step = Some(step);
            worker.item = item;
            worker.pos = 0;
            self.start_item(w)?;
        }
        if finished_empty {
            self.try_consume(g)?;
        }
        Ok(())
    }

    fn slot_of(&mut self, g: usize, step: u64) -> &mut Slot {
        let gpu = &mut self.gpus[g];
        let first = gpu.slots.front().map(|s| s.step).unwrap_or(0);
        &mut gpu.slots[(step - first) as usize]
    }

    /// Opens the worker's current sample and issues its first read, or finishes the batch.
    fn start_item(&mut self, w: usize) -> Result<()> {
        let g = self.workers[w].gpu;
        let step = self.workers[w].step.expect("worker without a batch");
        let item = self.workers[w].item;
        let read = self.slot_of(g, step).batch.reads.get(item).copied();
        let Some(read) = read else {
            self.slot_of(g, step).done = true;
            self.workers[w].step = None;
            self.try_consume(g)?;
            return self.fill(g);
        };
        let path = self.program.path(read.file);
        let fd = match self.open_files.get(&read.file) {
            Some(&fd) => fd,
            None => {
                let fd = self.backend.open(&path)?;
                if self.recorded {
                    self.open_files.insert(read.file, fd);
                }
                fd
            }
        };
        let worker = &mut self.workers[w];
        worker.fd = fd;
        worker.pos = 0;
        worker.path = path;
        self.submit_read(w, read)
    }

    fn submit_read(&mut self, w: usize, read: SampleRead) -> Result<()> {
        if read.advise {
            let (fd, offset, len) = (self.workers[w].fd, read.offset as libc::off_t, read.len as libc::off_t);
            // A hint: a failure changes what is cached ahead, not what is read.
            unsafe { libc::posix_fadvise(fd, offset, len, libc::POSIX_FADV_WILLNEED) };
            return self.after_read(w, read);
        }
        let max = self.max_request;
        let worker = &self.workers[w];
        let mut offset = read.offset + worker.pos;
        let mut len = (read.len - worker.pos).min(max);
        if read.mapped {
            let len = len.min(self.backend.buf_len()) as u32;
            self.workers[w].asked = len as u64;
            self.backend.submit_mapped(w, self.workers[w].fd, offset, len)?;
            self.in_flight += 1;
            self.count_issue(w);
            return Ok(());
        }
        if self.options.odirect {
            // O_DIRECT wants aligned offsets and lengths; recorded reads may not be.
            let start = offset / ALIGN * ALIGN;
            len = crate::dataset::round_up(offset + len - start, ALIGN);
            offset = start;
        }
        let len = len.min(self.backend.buf_len()) as u32;
        self.workers[w].asked = len as u64;
        self.backend.submit(w, self.workers[w].fd, offset, len)?;
        self.in_flight += 1;
        self.count_issue(w);
        Ok(())
    }
    fn count_issue(&mut self, w: usize) {
        let gpu = &mut self.gpus[self.workers[w].gpu];
        gpu.outstanding += 1;
        gpu.stats.max_outstanding_reads = gpu.stats.max_outstanding_reads.max(gpu.outstanding);
    }

    pub(super) fn read_done(&mut self, w: usize, res: i32) -> Result<()> {
        let g = self.workers[w].gpu;
        let step = self.workers[w].step.expect("completion for an idle worker");
        let item = self.workers[w].item;
        let read = self.slot_of(g, step).batch.reads[item];
        if res < 0 {
            let e = std::io::Error::from_raw_os_error(-res);
            bail!("reading {} at offset {}: {e}", self.workers[w].path.display(), read.offset + self.workers[w].pos);
        }
        let got = res as u64;
        let gpu = &mut self.gpus[g];
        gpu.outstanding -= 1;
        gpu.stats.bytes += got;
        gpu.cur.bytes += got;
        let worker = &mut self.workers[w];
        // An O_DIRECT read may have started before the sample (alignment): count progress
        // from the aligned start.
        let lead = if self.options.odirect { (read.offset + worker.pos) % ALIGN } else { 0 };
        worker.pos += got.saturating_sub(lead);
        // A request cut to the buffer's size goes on; a short read is the end of the file.
        if got > 0 && got >= worker.asked && worker.pos < read.len {
            return self.submit_read(w, read);
        }
        // Sample finished (or the file ended early: a short file is read as it is). The
        // worker spends its CPU time on it first, if any.
        if read.think_ns > 0 {
            worker.thinking = Some(read);
            let at = self.now() + read.think_ns;
            self.cpu_timers.push(Reverse((at, w)));
            return Ok(());
        }
        self.after_read(w, read)
    }

    /// A worker has finished read `read` of its batch (its CPU time after it included):
    /// it goes on to its next read, or the batch is done.
    pub(super) fn after_read(&mut self, w: usize, read: SampleRead) -> Result<()> {
        let g = self.workers[w].gpu;
        let step = self.workers[w].step.expect("a finished read of an idle worker");
        let item = self.workers[w].item;
        let worker = &mut self.workers[w];
        if self.recorded {
            worker.fd = -1;
            worker.step = None;
            if read.close {
                if let Some(fd) = self.open_files.remove(&read.file) {
                    self.backend.close(fd);
                }
            }
            let slot = self.slot_of(g, step);
            slot.outstanding -= 1;
            if slot.unassigned == 0 && slot.outstanding == 0 {
                slot.done = true;
                self.try_consume(g)?;
            }
            return self.fill(g);
        }
        worker.item += 1;
        worker.pos = 0;
        let next = self.slot_of(g, step).batch.reads.get(item + 1).copied();
        if let Some(next) = next.filter(|r| r.chain) {
            // The reader's next request on the same open file.
            return self.submit_read(w, next);
        }
        self.backend.close(self.workers[w].fd);
        self.workers[w].fd = -1;
        self.start_item(w)
    }

    /// If GPU `g` is waiting and its next batch is complete, take it and start computing.
    pub(super) fn try_consume(&mut self, g: usize) -> Result<()> {
        let now = self.now();
        let gpu = &mut self.gpus[g];
        let State::WaitBatch { since } = gpu.state else {
            return Ok(());
        };
        match gpu.slots.front() {
            Some(s) if s.step == gpu.step && s.done => {}
            _ => return Ok(()),
        }
        let slot = gpu.slots.pop_front().unwrap();
        gpu.consumed += 1;
        gpu.stats.io_wait_s += (now - since) as f64 / 1e9;
        gpu.stats.samples += slot.batch.samples as u64;
        gpu.cur.samples += slot.batch.samples as u64;
        let seconds = self.program.compute_seconds(g, gpu.epoch, gpu.step, &mut gpu.rng);
        let want = (seconds * 1e9) as u64;
        // fio's rule: overshoot of the previous sleep is taken off this one, not lost.
        let sleep = want.saturating_sub(gpu.carry_ns);
        gpu.carry_ns -= want - sleep;
        let handoff = (self.program.handoff_seconds(g) * 1e9) as u64;
        gpu.stats.io_wait_s += handoff as f64 / 1e9;
        gpu.state = State::Computing { start: now + handoff };
        self.timers.push(Reverse((now + handoff + sleep, g)));
        self.fill(g)
    }
}
