//! `trainio datagen` (and `replay --generate`): the dataset written by every rank, its
//! share of the files each, after the checks that keep a run from filling the disk;
//! and MLPerf's dataset-size rule printed against the dataset a command uses.

use super::{client_ram, Job, PRECHECK_FILES};
use crate::cluster::Cluster;
use crate::dataset::{self, Layout};
use crate::errors::InputError;
use crate::mlperf::datasize;
use anyhow::{bail, Result};

impl Job {
    /// Generates the dataset for `gpus`, every rank writing its share of the files.
    pub fn datagen(&self, cluster: &Cluster, gpus: u64) -> Result<()> {
        if !self.workload.train {
            bail!(InputError(format!(
                "{}: a checkpoint-only workload has no dataset to generate (run 'trainio replay' with it)",
                self.source
            )));
        }
        if let Some(target) = &self.s3 {
            return self.datagen_s3(target, cluster, gpus);
        }
        if cluster.is_root() {
            self.precheck_free_space(gpus)?;
        }
        let layout = self.layout(gpus)?;
        let clients = client_ram(cluster);
        if cluster.is_root() {
            self.print_size_check("datagen", &layout, gpus, None, clients);
            self.check_free_space(&layout)?;
            dataset::claim_directory(&self.data_dir, self.force)?;
            dataset::write_marker(&layout)?;
        }
        cluster.barrier()?;
        let started = std::time::Instant::now();
        let bytes = dataset::generate(&layout, cluster.rank, cluster.size, self.engine.progress && cluster.is_root())?;
        cluster.barrier()?;
        if cluster.is_root() {
            eprintln!(
                "trainio datagen: {} files, {:.1} MiB in {} ({:.1} MiB written by rank 0 in {:.1} s)",
                layout.files.len(),
                layout.total_bytes() as f64 / 1048576.0,
                self.data_dir.display(),
                bytes as f64 / 1048576.0,
                started.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }

    /// Datagen to object storage: every rank PUTs its share of the objects.
    fn datagen_s3(&self, target: &crate::object::s3_writes::S3Target, cluster: &Cluster, gpus: u64) -> Result<()> {
        let layout = self.layout(gpus)?;
        if cluster.is_root() {
            self.print_size_check("datagen", &layout, gpus, None, client_ram(cluster));
        }
        cluster.barrier()?;
        let started = std::time::Instant::now();
        let bytes = crate::object::s3_writes::generate(target, &layout, cluster.rank, cluster.size)?;
        cluster.barrier()?;
        if cluster.is_root() {
            eprintln!(
                "trainio datagen: {} objects, {:.1} MiB in {} ({:.1} MiB put by rank 0 in {:.1} s, {})",
                layout.files.len(),
                layout.total_bytes() as f64 / 1048576.0,
                target.store.uri(),
                bytes as f64 / 1048576.0,
                started.elapsed().as_secs_f64(),
                target.store.library.name()
            );
        }
        Ok(())
    }

    /// Steps per epoch each GPU gets from `layout` (its shard of whole batches, at most
    /// --steps), as the workload program counts them.
    fn layout_steps(&self, layout: &Layout, gpus: u64) -> u64 {
        let per_gpu = layout.files.len() as u64 / gpus.max(1) * layout.samples_per_file;
        let steps = per_gpu / self.workload.batch_size.max(1);
        if self.max_steps > 0 {
            steps.min(self.max_steps)
        } else {
            steps
        }
    }

    /// Prints (rank 0, workload mode; standard output) MLPerf's dataset-size rule for this run against
    /// the dataset it uses.
    pub(super) fn print_size_check(
        &self,
        cmd: &str,
        layout: &Layout,
        gpus: u64,
        steps: Option<u64>,
        clients: Option<(u64, u64)>,
    ) {
        let (Some((hosts, ram)), None) = (clients, self.source.recorded()) else { return };
        let rule = datasize::sizing(&self.workload, gpus, hosts, ram);
        let steps = steps.unwrap_or_else(|| self.layout_steps(layout, gpus));
        // On standard output: information, not a complaint (an error stays one line on
        // standard error).
        println!(
            "trainio {cmd}: {}",
            datasize::check_line(&rule, layout.files.len() as u64, layout.total_bytes(), steps)
        );
    }

    /// Refuses, before the layout of a large dataset (memory in proportion to the files) is built, a dataset
    /// that cannot fit whatever is already there: its files times the least a file takes
    /// (its samples rounded up to 4 KiB, plus one block), less the bytes of the dataset in
    /// --data-dir now, against the free space. `check_free_space` is the exact check.
    pub(super) fn precheck_free_space(&self, gpus: u64) -> Result<()> {
        if self.source.recorded().is_some() {
            return Ok(());
        }
        let w = &self.workload;
        let files = self.bounded_files(gpus)?;
        if files < PRECHECK_FILES {
            return Ok(()); // a small layout: check_free_space's exact count is cheap
        }
        let sample = if w.record_length_stdev > 0.0 {
            dataset::ALIGN
        } else {
            dataset::round_up((w.record_length.ceil() as u64).max(1), dataset::ALIGN)
        };
        let least = files.saturating_mul(w.num_samples_per_file.saturating_mul(sample).saturating_add(dataset::ALIGN));
        let have = dataset::marker_bytes(&self.data_dir);
        let super::space::Free { bytes: free, dir, .. } = super::space::free_space(&self.data_dir)?;
        if least.saturating_sub(have) > free {
            bail!(InputError(format!(
                "--data-dir {}: {files} files of at least {} each need {} and the file system of {} has {} free: lower dataset.num_files_train (--param), --gpus, --steps or --batch-size, or free space",
                self.data_dir.display(),
                datasize::human_bytes((least / files.max(1)) as f64),
                datasize::human_bytes(least as f64),
                dir.display(),
                datasize::human_bytes(free as f64)
            )));
        }
        Ok(())
    }

    /// Refuses, before anything is written, a dataset whose missing files do not fit the
    /// free space of --data-dir's file system (each new file counted one 4 KiB block
    /// more, for its inode's extents and directory entry).
    fn check_free_space(&self, layout: &Layout) -> Result<()> {
        let (mut missing, mut bytes) = (0u64, 0u64);
        let exists = self.data_dir.is_dir();
        for (rel, size) in (0..layout.files.len()).flat_map(|i| layout.on_disk(i)) {
            let have = exists
                && std::fs::symlink_metadata(layout.root.join(&rel))
                    .map(|m| m.is_file() && m.len() == size)
                    .unwrap_or(false);
            if !have {
                missing += 1;
                bytes += size;
            }
        }
        let need = bytes + missing * dataset::ALIGN;
        let super::space::Free { bytes: free, dir, .. } = super::space::free_space(&self.data_dir)?;
        if need > free {
            bail!(InputError(format!(
                "--data-dir {}: the dataset needs {need} B ({}) more for {missing} files and the file system of {} has {free} B ({}) free: lower dataset.num_files_train (--param), --gpus or --steps, or free space",
                self.data_dir.display(),
                datasize::human_bytes(need as f64),
                dir.display(),
                datasize::human_bytes(free as f64)
            )));
        }
        Ok(())
    }
}
