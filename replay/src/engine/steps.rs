//! A step's end: the compute's deadline, the step barrier across the job's GPUs, the
//! checkpoints and trace write bursts written between steps, and each GPU's epochs and
//! AU as they close.

use super::{Backend, Engine, Gpu, Program, State};
use anyhow::{bail, Result};

impl<'a, P: Program, B: Backend> Engine<'a, P, B> {
    pub(super) fn compute_done(&mut self, g: usize, deadline: u64, now: u64) -> Result<()> {
        let over = now - deadline;
        *self.overshoot.entry(over / 1000).or_default() += 1;
        let gpu = &mut self.gpus[g];
        let State::Computing { start } = gpu.state else {
            bail!("internal error: timer for a GPU that is not computing")
        };
        gpu.carry_ns += over;
        let compute = (now - start) as f64 / 1e9;
        gpu.stats.compute_s += compute;
        if gpu.first_step_end.is_some() && gpu.block_start.is_none() {
            gpu.cur.compute_after_first_s += compute;
        }
        if self.options.barrier {
            gpu.state = State::AtBarrier { since: now };
            self.at_barrier += 1;
            // Under the barrier all GPUs move in lockstep and finish together: none is Done here.
            if self.at_barrier == self.gpus.len() {
                self.pending_barrier = Some(self.cluster.start_barrier());
            }
            Ok(())
        } else {
            let now = self.trace_writes(&[g], now)?.unwrap_or(now);
            self.end_step(g, now)
        }
    }

    /// Trace mode: the write bursts GPUs `gs` made after the step they have just finished
    /// (trace_writes.rs), all at once, one thread each. Every GPU of the rank stands still
    /// meanwhile, and the time counts in AU as time not computing, as it did in the
    /// recorded job (`checkpoint_s` reports it). Returns when they ended, None when there
    /// were none.
    fn trace_writes(&mut self, gs: &[usize], now: u64) -> Result<Option<u64>> {
        let mut due = Vec::new();
        let mut bursts = Vec::new();
        for &g in gs {
            let (epoch, step) = (self.gpus[g].epoch, self.gpus[g].step + 1);
            let calls = self.program.writes_after(g, epoch, step);
            if !calls.is_empty() {
                due.push((epoch, step));
                bursts.push(calls);
            }
        }
        if bursts.is_empty() {
            return Ok(None);
        }
        let done = self.program.run_write_bursts(&bursts, &mut self.write_buf)?;
        let end = self.now();
        let stood = (end - now) as f64 / 1e9;
        for gpu in &mut self.gpus {
            gpu.cur.checkpoint_s += stood;
        }
        for ((epoch, step), (io, took)) in due.into_iter().zip(done) {
            self.checkpoints.push(crate::checkpoint::checkpointing::CheckpointIo {
                phase: "trace-write".into(),
                index: self.checkpoints.len() as u64 + 1,
                epoch: epoch + 1,
                step,
                duration_s: took,
                stall_s: stood,
                bytes: io.bytes,
                files: io.files,
            });
        }
        Ok(Some(end))
    }

    pub(super) fn release_barrier(&mut self) -> Result<()> {
        let mut now = self.now();
        let mut block_start = None;
        self.at_barrier = 0;
        for g in 0..self.gpus.len() {
            if let State::AtBarrier { since } = self.gpus[g].state {
                self.gpus[g].stats.barrier_wait_s += (now - since) as f64 / 1e9;
            }
        }
        if let Some(c) = self.checkpointer {
            // Under the barrier every GPU of the job has just finished the same step.
            let (epoch, step) = (self.gpus[0].epoch + 1, self.gpus[0].step + 1);
            let spe = self.program.steps_per_epoch();
            if c.due(epoch, step, spe) {
                let index = self.checkpoints.len() as u64 + 1;
                let io = c.write(self.cluster, index, epoch, step)?;
                let end = self.now();
                let stood = (end - now) as f64 / 1e9;
                for gpu in &mut self.gpus {
                    gpu.cur.checkpoint_s += stood;
                    // A checkpoint inside the epoch's first step is left out with that step.
                    if gpu.first_step_end.is_some() {
                        gpu.cur.excluded_s += stood;
                    }
                }
                if step < spe {
                    block_start = Some(end);
                }
                self.checkpoints.push(io);
                now = end;
            }
        }
        let all: Vec<usize> = (0..self.gpus.len()).collect();
        if let Some(end) = self.trace_writes(&all, now)? {
            now = end;
        }
        for g in 0..self.gpus.len() {
            if let State::AtBarrier { .. } = self.gpus[g].state {
                self.end_step(g, now)?;
                // Set after the step ends: it marks the next step as the block's first.
                if block_start.is_some() {
                    self.gpus[g].block_start = block_start;
                }
            }
        }
        Ok(())
    }

    fn end_step(&mut self, g: usize, now: u64) -> Result<()> {
        let spe = self.program.steps_per_epoch();
        let epochs = self.program.epochs();
        let gpu = &mut self.gpus[g];
        gpu.stats.steps += 1;
        gpu.cur.steps += 1;
        gpu.step += 1;
        if gpu.first_step_end.is_none() {
            gpu.first_step_end = Some(now);
        } else if let Some(start) = gpu.block_start.take() {
            // DLIO's new block after a checkpoint: its first step is left out of AU too.
            gpu.cur.excluded_s += (now - start) as f64 / 1e9;
        }
        if g == 0 {
            if let Some(au) = self.bar.shown().then(|| au_so_far(gpu, now)).flatten() {
                self.bar.set_note(format!("AU so far {:.1}%", 100.0 * au));
            }
            self.bar.inc(1);
        }
        let gpu = &mut self.gpus[g];
        if gpu.step == spe {
            close_epoch(gpu, now);
            if gpu.epoch == epochs {
                gpu.state = State::Done;
                final_au(gpu);
                return Ok(());
            }
        }
        gpu.state = State::WaitBatch { since: now };
        self.fill(g)?;
        self.try_consume(g)
    }
}

/// Ends the GPU's epoch under way at `now` (its `cur` figures become an EpochStats).
pub(super) fn close_epoch(gpu: &mut Gpu, now: u64) {
    let first_end = gpu.first_step_end.unwrap_or(now);
    let mut e = std::mem::take(&mut gpu.cur);
    e.epoch = gpu.epoch;
    e.duration_s = (now - gpu.epoch_start) as f64 / 1e9;
    e.first_step_s = (first_end - gpu.epoch_start) as f64 / 1e9;
    let rest = (now - first_end) as f64 / 1e9 - e.excluded_s;
    e.au = if rest > 0.0 { e.compute_after_first_s / rest } else { 0.0 };
    gpu.stats.epochs.push(e);
    gpu.epoch += 1;
    gpu.step = 0;
    gpu.consumed = 0;
    gpu.next_to_start = 0;
    gpu.first_step_end = None;
    gpu.epoch_start = now;
}

/// The GPU's AU from its start to `now`, a step having just ended: its finished epochs and
/// the one it is in, each epoch's first step left out as in [`final_au`]. None before
/// there is a step to count.
fn au_so_far(gpu: &Gpu, now: u64) -> Option<f64> {
    let (mut c, mut t) =
        gpu.stats.epochs.iter().fold((0.0, 0.0), |(c, t), e| {
            (c + e.compute_after_first_s, t + e.duration_s - e.first_step_s - e.excluded_s)
        });
    if let Some(first_end) = gpu.first_step_end {
        c += gpu.cur.compute_after_first_s;
        t += now.saturating_sub(first_end) as f64 / 1e9 - gpu.cur.excluded_s;
    }
    (t > 0.0).then(|| (c / t).min(1.0))
}

/// The GPU's AU over its epochs (DLIO's: each epoch's first step left out).
pub(super) fn final_au(gpu: &mut Gpu) {
    let (c, t): (f64, f64) =
        gpu.stats.epochs.iter().fold((0.0, 0.0), |(c, t), e| {
            (c + e.compute_after_first_s, t + e.duration_s - e.first_step_s - e.excluded_s)
        });
    // With one step per epoch nothing is left after excluding it: fall back to the whole
    // run rather than report 0.
    gpu.stats.au = if t > 0.0 {
        c / t
    } else {
        gpu.stats.compute_s / gpu.stats.epochs.iter().map(|e| e.duration_s).sum::<f64>().max(1e-9)
    };
}
