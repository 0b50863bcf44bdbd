//! Workload mode: what each simulated GPU reads, derived from a DLIO workload and the
//! dataset layout. GPU g of N reads its own shard (every N-th file), `batch_size` samples
//! per step, in file order unless the workload asks for shuffling.

use crate::dataset::Layout;
use crate::engine::{Batch, Program, SampleRead};
use crate::workload::{ComputeTime, Shuffle, Workload};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::cell::RefCell;
use std::path::PathBuf;

/// (epoch, sample order of that epoch).
type EpochOrder = (u64, Vec<u32>);

pub struct WorkloadProgram {
    pub layout: Layout,
    pub batch_size: u64,
    pub read_threads: usize,
    pub prefetch_size: usize,
    pub transfer_size: u64,
    pub compute: ComputeTime,
    pub epochs: u64,
    pub steps_per_epoch: u64,
    file_shuffle: Shuffle,
    sample_shuffle: Shuffle,
    seed: u64,
    /// Per local GPU: its global index and the files of its shard.
    shards: Vec<(u64, Vec<usize>)>,
    /// Per local GPU: (epoch, sample order) so a shuffled order is computed once per epoch.
    orders: RefCell<Vec<Option<EpochOrder>>>,
}

impl WorkloadProgram {
    /// `max_steps` caps the steps per epoch (0 = no cap).
    pub fn new(
        workload: &Workload,
        layout: Layout,
        total_gpus: u64,
        local: &[u64],
        transfer_size: u64,
        max_steps: u64,
    ) -> WorkloadProgram {
        let shards: Vec<(u64, Vec<usize>)> = local.iter().map(|&g| (g, layout.shard(g, total_gpus))).collect();
        let files_per_gpu = layout.files.len() as u64 / total_gpus;
        let mut steps = files_per_gpu * layout.samples_per_file / workload.batch_size;
        if max_steps > 0 {
            steps = steps.min(max_steps);
        }
        let n = shards.len();
        WorkloadProgram {
            layout,
            batch_size: workload.batch_size,
            read_threads: workload.read_threads as usize,
            prefetch_size: workload.prefetch_size as usize,
            transfer_size,
            compute: workload.computation_time.clone(),
            epochs: workload.epochs,
            steps_per_epoch: steps,
            file_shuffle: workload.file_shuffle,
            sample_shuffle: workload.sample_shuffle,
            seed: workload.seed,
            shards,
            orders: RefCell::new(vec![None; n]),
        }
    }

    /// The order in which GPU `gpu` reads its shard's samples in `epoch`.
    pub fn sample_order(&self, gpu: usize, epoch: u64) -> Vec<u32> {
        let (global, files) = &self.shards[gpu];
        let spf = self.layout.samples_per_file as u32;
        let mut file_order: Vec<u32> = (0..files.len() as u32).collect();
        // Seeded shuffles differ per epoch and per GPU but repeat from run to run.
        let base = self.seed ^ (epoch << 32) ^ (global << 8);
        let rng = |kind: u64, s: Shuffle| {
            let salt = if s == Shuffle::Random { rand::random::<u64>() } else { 0 };
            StdRng::seed_from_u64(base ^ kind ^ salt)
        };
        if self.file_shuffle != Shuffle::Off {
            file_order.shuffle(&mut rng(1, self.file_shuffle));
        }
        let mut order: Vec<u32> = file_order.iter().flat_map(|&f| (0..spf).map(move |s| f * spf + s)).collect();
        if self.sample_shuffle != Shuffle::Off {
            order.shuffle(&mut rng(2, self.sample_shuffle));
        }
        order
    }
}

impl Program for WorkloadProgram {
    fn epochs(&self) -> u64 {
        self.epochs
    }

    fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    fn batch(&self, gpu: usize, epoch: u64, step: u64) -> Batch {
        let mut orders = self.orders.borrow_mut();
        if orders[gpu].as_ref().map(|(e, _)| *e) != Some(epoch) {
            orders[gpu] = Some((epoch, self.sample_order(gpu, epoch)));
        }
        let order = &orders[gpu].as_ref().unwrap().1;
        let spf = self.layout.samples_per_file;
        let files = &self.shards[gpu].1;
        let from = (step * self.batch_size) as usize;
        let to = (from + self.batch_size as usize).min(order.len());
        let reads = order[from..to]
            .iter()
            .map(|&k| {
                let file = files[(k as u64 / spf) as usize];
                let sample = self.layout.files[file].sample;
                let shape = crate::formats::shape(self.layout.format, spf, sample);
                let stride = if self.layout.format == crate::formats::Format::TfRecord {
                    sample + crate::formats::TFRECORD_FRAME
                } else {
                    sample
                };
                SampleRead { file: file as u32, offset: shape.data + (k as u64 % spf) * stride, len: sample }
            })
            .collect::<Vec<_>>();
        Batch { samples: reads.len() as u32, reads, streams: Vec::new() }
    }

    fn compute_seconds(&self, _gpu: usize, _epoch: u64, _step: u64, rng: &mut StdRng) -> f64 {
        self.compute.sample(rng)
    }

    fn path(&self, file: u32) -> PathBuf {
        self.layout.path(file as usize)
    }

    fn root(&self) -> &std::path::Path {
        &self.layout.root
    }

    fn read_threads(&self, _gpu: usize) -> usize {
        self.read_threads
    }

    fn prefetch_size(&self, _gpu: usize) -> usize {
        self.prefetch_size
    }

    fn max_request(&self) -> u64 {
        let largest = self.layout.files.iter().map(|f| f.sample).max().unwrap_or(1);
        self.transfer_size.min(largest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn batches_cover_the_shard_once() {
        let y = "dataset:\n  num_files_train: 12\n  num_samples_per_file: 2\n  record_length_bytes: 8192\nreader:\n  batch_size: 3\n  sample_shuffle: seed\ntrain:\n  computation_time: 0.1\n";
        let w = Workload::from_yaml(y, "t").unwrap();
        let layout = Layout::from_workload(&w, 2, 0, Path::new("/d"));
        let p = WorkloadProgram::new(&w, layout, 2, &[1], 1 << 20, 0);
        assert_eq!(p.steps_per_epoch, 4, "6 files × 2 samples / batch 3");
        let mut seen = Vec::new();
        for s in 0..4 {
            for r in p.batch(0, 0, s).reads {
                assert_eq!(r.file % 2, 1, "GPU 1 of 2 reads odd files only");
                seen.push((r.file, r.offset));
            }
        }
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 12);
    }
}
