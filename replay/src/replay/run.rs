//! Running the replay: the dataset checked, the program of the mode built (the workload's
//! reader, or the trace's recorded GPUs) with the settings the results echo, the engine
//! run on each rank over its backend (files or object storage), and the ranks' reports
//! combined on rank 0.

use super::{client_ram, mem_total_bytes, split, Job, Recorded};
use crate::checkpoint::checkpointing;
use crate::cluster::Cluster;
use crate::dataset::{self, Layout};
use crate::engine::{Engine, Program};
use crate::errors::InputError;
use crate::mlperf::datasize;
use crate::results::{self, RankReport, Settings};
use crate::trace::trace_input::{Placement, TraceOptions, TraceProgram};
use crate::workload::program::WorkloadProgram;
use anyhow::{bail, Context, Result};

/// What a run reads, checked (Job::checked_dataset).
struct Checked {
    /// Trace mode: which files each simulated GPU reads.
    placement: Option<Placement>,
    layout: Layout,
    /// Rank 0: the client hosts and their RAM (client_ram).
    clients: Option<(u64, u64)>,
    /// This rank's simulated GPUs.
    local: Vec<u64>,
    /// Object storage: the layout the engine reads and its largest request.
    object_layout: Option<(Layout, u64)>,
    /// The files and bytes the job's GPUs read.
    used_files: u64,
    used_bytes: u64,
}

impl Job {
    /// Runs the replay with `gpus` simulated GPUs. Rank 0 gets the results.
    pub fn run(&self, cluster: &Cluster, gpus: u64) -> Result<Option<serde_json::Value>> {
        if self.generate {
            self.datagen(cluster, gpus)?;
        }
        self.run_generated(cluster, gpus)
    }

    /// `run` without generating the dataset first (`--record` generates before it starts
    /// the recorder, so the recording holds the replay's I/O and not datagen's writes).
    pub fn run_generated(&self, cluster: &Cluster, gpus: u64) -> Result<Option<serde_json::Value>> {
        let checked = self.checked_dataset(cluster, gpus)?;
        match self.source.recorded() {
            None => self.run_workload(cluster, gpus, checked),
            Some(recorded) => self.run_trace(cluster, gpus, recorded, checked),
        }
    }

    /// What a run reads, checked before it starts (the files or objects each rank's GPUs
    /// read are there, at their sizes), and the bytes the GPUs read in all.
    fn checked_dataset(&self, cluster: &Cluster, gpus: u64) -> Result<Checked> {
        let placement = self.placement(gpus);
        let layout = self.layout(gpus)?;
        let clients = client_ram(cluster);
        let local = split(gpus, cluster.size, cluster.rank);
        // Each rank checks the files its own GPUs read.
        let mut mine: Vec<usize> =
            local.iter().flat_map(|&g| self.files_of(&layout, placement.as_ref(), g, gpus)).collect();
        mine.sort_unstable();
        mine.dedup();
        let sizing = match self.source.recorded() {
            Some(_) => format!("the trace's files for --gpus {gpus}"),
            None => format!(
                "--gpus {gpus} × {} × --batch-size {} samples, at least dataset.num_files_train {}",
                match self.max_steps {
                    0 => "one step".to_string(),
                    s => format!("--steps {s}"),
                },
                self.workload.batch_size,
                self.workload.num_files_train
            ),
        };
        let mut object_layout = None;
        match (placement.as_ref().filter(|p| p.in_place()), &self.s3) {
            (Some(p), _) => p.verify_in_place(&mine).map_err(InputError)?,
            (None, Some(t)) => object_layout = Some(self.s3_layout(t, &layout, &mine, &sizing)?),
            // DLIO's dataset: every file checked when the layout was made from them.
            (None, None) if self.in_place_dlio() => {
                if cluster.is_root() {
                    eprintln!(
                        "trainio replay: note: {}: DLIO's dataset, read in place: {} files of {}; each file is read whole in {} B requests (the reads numpy.load or DLIO's reader make of its files are not modeled)",
                        self.data_dir.display(),
                        layout.files.len(),
                        crate::mlperf::datasize::human_bytes(layout.total_bytes() as f64),
                        self.transfer_size
                    );
                }
            }
            (None, None) => layout.verify_files(&mine, &sizing)?,
        }
        let used: Vec<usize> = match &placement {
            // The layout holds only the files some GPU reads, each once.
            Some(_) => (0..layout.files.len()).collect(),
            None => (0..gpus).flat_map(|g| self.files_of(&layout, None, g, gpus)).collect(),
        };
        let used_bytes: u64 = used.iter().flat_map(|&i| layout.on_disk(i)).map(|(_, size)| size).sum();
        Ok(Checked { placement, layout, clients, local, object_layout, used_files: used.len() as u64, used_bytes })
    }

    /// Workload mode: each GPU reads its shard of the dataset as the workload's reader does.
    fn run_workload(&self, cluster: &Cluster, gpus: u64, checked: Checked) -> Result<Option<serde_json::Value>> {
        let Checked { layout, clients, local, object_layout, used_files, used_bytes, .. } = checked;
        let w = &self.workload;
        let (read_layout, transfer) = match &object_layout {
            Some((l, largest)) => (l.clone(), *largest),
            None => (layout.clone(), self.transfer_size),
        };
        let program = WorkloadProgram::new(
            w,
            read_layout,
            gpus,
            &local,
            transfer,
            self.max_steps,
            self.engine.odirect,
            self.tf_buffer,
        );
        if program.steps_per_epoch == 0 {
            bail!(InputError(format!(
                "each GPU's shard holds fewer samples than one batch ({} files of {} samples for {} GPUs, batch {})",
                layout.files.len(),
                layout.samples_per_file,
                gpus,
                w.batch_size
            )));
        }
        // Datagen printed it when it ran in this process.
        if !self.generate {
            self.print_size_check("replay", &layout, gpus, Some(program.steps_per_epoch), clients);
        }
        if cluster.is_root() && program.steps_per_epoch < 500 && self.max_steps == 0 {
            eprintln!(
                "trainio replay: note: {} steps per epoch; MLPerf Storage wants at least 500 (raise dataset.num_files_train or pass --steps)",
                program.steps_per_epoch
            );
        }
        let settings = Settings {
            mode: "workload".into(),
            source: self.source.to_string(),
            name: w.name.clone(),
            data_dir: self.data_dir.display().to_string(),
            batch_size: w.batch_size,
            read_threads: w.read_threads,
            prefetch_size: w.prefetch_size,
            transfer_size: self.transfer_size,
            computation_time: w.computation_time.describe(),
            computation_time_mean_s: w.computation_time.mean(),
            steps_per_epoch: program.steps_per_epoch,
            epochs: w.epochs,
            barrier: self.engine.barrier,
            odirect: self.engine.odirect,
            drop_caches: self.drop_caches,
            realtime: self.engine.realtime,
            io_engine: if self.engine.psync { "psync" } else { "io_uring" }.into(),
            nominal_sample_bytes: w.record_length,
            dataset_files: used_files,
            dataset_bytes: used_bytes,
            params: w.params.clone(),
            reader: Some(program.reader_json(&w.format, &w.data_loader)),
            templates: None,
            gpus_per_process: None,
            compute_scale: None,
            required_mib_s_per_gpu: crate::mlperf::datasize::need_bytes_per_s(w).map(|b| b / (1u64 << 20) as f64),
            map_path: None,
        };
        let objects = match (&self.s3, &object_layout) {
            (Some(t), Some((l, _))) => Some(crate::object::s3_reads::ObjectSet {
                bucket: t.store.bucket.clone(),
                prefix: t.store.prefix.clone(),
                root: l.root.clone(),
                sizes: l.files.iter().map(|f| (f.rel.clone(), f.size)).collect(),
            }),
            _ => None,
        };
        self.execute(cluster, &program, &local, gpus, used_bytes, settings, clients, objects)
    }

    /// Trace mode: each GPU replays a recorded GPU's reads, compute and writes.
    fn run_trace(
        &self,
        cluster: &Cluster,
        gpus: u64,
        recorded: &Recorded,
        checked: Checked,
    ) -> Result<Option<serde_json::Value>> {
        let Checked { placement, clients, local, object_layout, used_files, used_bytes, .. } = checked;
        let w = &self.workload;
        let templates = &recorded.templates;
        let program = TraceProgram::new(
            templates.to_vec(),
            placement.expect("trace mode has a placement"),
            &self.data_dir,
            gpus,
            &local,
            TraceOptions {
                epochs: w.epochs,
                max_steps: self.max_steps,
                compute_override: self.compute_override,
                prefetch_override: self.prefetch_override.map(|p| p as usize),
            },
        )
        .with_object_store(self.s3.clone());
        let used_t = &templates[..templates.len().min(gpus as usize)];
        let bytes: u64 = used_t.iter().map(|t| t.bytes).sum();
        // Per step: over the steps the GPUs took (their untaken batches have no compute).
        let steps: u64 = used_t.iter().map(|t| t.taken as u64).sum();
        let samples: u64 = used_t.iter().flat_map(|t| t.taken_steps()).map(|s| s.samples as u64).sum();
        let compute: f64 = used_t.iter().flat_map(|t| t.taken_steps()).map(|s| s.compute_s).sum();
        // Per simulated GPU: the templates' own needs, or with --computation-time
        // their bytes per step over it.
        let needs: Vec<f64> = used_t
            .iter()
            .filter_map(|t| match self.compute_override {
                Some(c) if c > 0.0 => Some(t.taken_bytes() as f64 / t.taken.max(1) as f64 / c / (1u64 << 20) as f64),
                Some(_) => None,
                None => t.required_mib_s,
            })
            .collect();
        let required = median(&needs);
        if cluster.is_root() {
            for line in trainio_model::describe(&recorded.model) {
                eprintln!("trainio replay: {line}");
            }
        }
        let settings = Settings {
            mode: "trace".into(),
            source: self.source.to_string(),
            name: w.name.clone(),
            data_dir: self.data_dir.display().to_string(),
            batch_size: (samples as f64 / steps.max(1) as f64).round() as u64,
            read_threads: used_t.iter().map(|t| t.concurrency as u64).max().unwrap_or(1),
            prefetch_size: self
                .prefetch_override
                .unwrap_or(used_t.iter().map(|t| t.prefetch as u64).max().unwrap_or(1)),
            transfer_size: program.max_request(),
            computation_time: match self.compute_override {
                Some(c) => format!("{c} s (--computation-time)"),
                None => "inferred per GPU from the trace (job model)".into(),
            },
            computation_time_mean_s: self.compute_override.unwrap_or(if steps > 0 { compute / steps as f64 } else { 0.0 }),
            steps_per_epoch: program.steps_per_epoch,
            epochs: w.epochs,
            barrier: self.engine.barrier,
            odirect: self.engine.odirect,
            drop_caches: self.drop_caches,
            realtime: self.engine.realtime,
            io_engine: if self.engine.psync { "psync" } else { "io_uring" }.into(),
            nominal_sample_bytes: if samples > 0 { bytes as f64 / samples as f64 } else { 0.0 },
            dataset_files: used_files,
            dataset_bytes: used_bytes,
            params: Vec::new(),
            reader: None,
            templates: Some(
                program
                    .templates()
                    .iter()
                    .map(|t| serde_json::json!({
                        "host": t.host, "pid": t.pid, "comm": t.comm, "files": t.files.len(), "steps": t.taken, "untaken": t.steps.len() - t.taken,
                        "readers": t.concurrency, "workers": t.workers, "synchronous": t.synchronous, "paced": t.paced,
                        "prefetch": t.prefetch, "compute_s": t.compute_s, "handoff_s": t.handoff_s, "sync_s": t.sync_s, "bytes": t.bytes, "dev": t.dev,
                        "write_bursts": t.write_bursts.len(), "write_bytes": t.write_bytes(), "write_files": t.write_files.len(),
                        "write_after_steps": t.write_bursts.keys().collect::<Vec<_>>(),
                        "required_mib_s": t.required_mib_s,
                    }))
                    .collect(),
            ),
            gpus_per_process: Some(recorded.gpus_per_process),
            compute_scale: Some(recorded.compute_scale.unwrap_or(1.0)),
            required_mib_s_per_gpu: required,
            map_path: Some(
                recorded
                    .map_path
                    .as_ref()
                    .map(|m| {
                        m.0.iter().map(|(o, n)| format!("{}={}", o.display(), n.display())).collect()
                    })
                    .unwrap_or_default(),
            ),
        };
        let objects =
            object_layout.as_ref().zip(self.s3.as_ref()).map(|((l, _), t)| crate::object::s3_reads::ObjectSet {
                bucket: t.store.bucket.clone(),
                prefix: t.store.prefix.clone(),
                root: l.root.clone(),
                sizes: l.files.iter().map(|f| (f.rel.clone(), f.size)).collect(),
            });
        self.execute(cluster, &program, &local, gpus, used_bytes, settings, clients, objects)
    }

    #[allow(clippy::too_many_arguments)]
    fn execute<P: Program>(
        &self,
        cluster: &Cluster,
        program: &P,
        local: &[u64],
        gpus: u64,
        used_bytes: u64,
        settings: Settings,
        clients: Option<(u64, u64)>,
        objects: Option<crate::object::s3_reads::ObjectSet>,
    ) -> Result<Option<serde_json::Value>> {
        if let (Some((hosts, client_ram)), None) = (clients, &self.s3) {
            if !self.engine.odirect
                && !self.drop_caches
                && used_bytes < 5 * client_ram
                && !self.cache_warned.swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                eprintln!(
                    "trainio replay: warning: the dataset ({}) is smaller than 5 × the RAM of the {hosts} client host(s) (5 × {} = {}): reads may come from the page cache and AU would say nothing about storage; pass --odirect or --drop-caches, or generate more data (MLPerf's rule)",
                    datasize::gib(used_bytes as f64),
                    datasize::gib(client_ram as f64),
                    datasize::gib(5.0 * client_ram as f64)
                );
            }
        }
        if self.drop_caches {
            unsafe { libc::sync() };
            std::fs::write("/proc/sys/vm/drop_caches", b"3")
                .context("--drop-caches: writing /proc/sys/vm/drop_caches (needs root)")?;
        }
        program.prepare()?;
        let options = self.engine.clone();
        // Checkpoints go into the dataset's directory, which the dataset marker makes ours.
        let checkpointer = match self.source.recorded() {
            None => self.checkpointer(cluster, gpus)?,
            Some(_) => None,
        };
        if let Some(c) = &checkpointer {
            let (epochs, spe) = (program.epochs(), program.steps_per_epoch());
            let writes = checkpointing::writes_in(&c.spec, epochs, spe);
            self.check_checkpoint_space(cluster, c, writes, |e, s| e <= epochs && s <= spe && c.due(e, s, spe))?;
        }
        let run = match (&self.s3, objects) {
            (Some(t), Some(objects)) => {
                let slots = (0..local.len()).map(|g| program.read_threads(g).max(1)).sum();
                let backend = crate::object::s3_reads::S3Reads::new(
                    slots,
                    (*t.endpoint).clone(),
                    t.store.library.pattern(),
                    objects,
                    program.max_request().max(1),
                )?;
                let engine =
                    Engine::with_backend(program, local, cluster.rank, cluster, options, self.workload.seed, backend)?
                        .with_checkpoints(checkpointer.as_ref());
                cluster.barrier()?;
                timed(|| metered(|| engine.run()))?
            }
            _ => {
                let engine = Engine::new(program, local, cluster.rank, cluster, options, self.workload.seed)?
                    .with_checkpoints(checkpointer.as_ref());
                cluster.barrier()?;
                timed(|| metered(|| engine.run()))?
            }
        };
        let ((run, client), cpu_s) = run;
        let mut run = run;
        if let (Some(t), Some(reads)) = (&self.s3, run.object.take()) {
            // The reads' log and this rank's other requests (checkpoints) together.
            let mut all = crate::object::s3_client::RequestLog::from_wire(&reads).unwrap_or_default();
            all.merge(&t.log.lock().unwrap());
            run.object = Some(all.to_wire());
        }
        let report = RankReport {
            rank: cluster.rank,
            hostname: cluster.hostname.clone(),
            mem_total_bytes: mem_total_bytes(),
            cpu_s,
            client,
            run,
        };
        let gathered = cluster.gather(serde_json::to_vec(&report)?);
        let Some(all) = gathered else { return Ok(None) };
        let reports: Vec<RankReport> =
            all.iter().map(|b| serde_json::from_slice(b)).collect::<Result<_, _>>().context("decoding rank results")?;
        let mut summary = results::summarize(&reports, &settings, self.threshold_percent);
        if let Some(why) = reports.iter().find_map(|r| r.run.stopped.clone()) {
            summary["stopped"] = why.into();
        }
        if let Some(lost) = cluster.lost() {
            // Found at the gather (--no-barrier: the ranks still heard from ran to their
            // end): the results are theirs.
            if summary.get("stopped").is_none() {
                summary["stopped"] =
                    format!("{}: the results are those of the ranks still heard from", lost.describe()).into();
            }
            summary["lost"] = lost.to_json();
        }
        if let Some(c) = &checkpointer {
            let per_rank: Vec<_> = reports.iter().map(|r| r.run.checkpoints.clone()).collect();
            summary["checkpoint"] = checkpointing::with_ios(checkpointing::plan_json(&c.spec, &c.plan), &per_rank);
        }
        if self.source.recorded().is_some() {
            let per_rank: Vec<_> = reports.iter().map(|r| r.run.checkpoints.clone()).collect();
            summary["writes"] = crate::trace::trace_writes::summary(&per_rank);
        }
        if let Some(t) = &self.s3 {
            if let Some(o) =
                crate::object::s3_writes::combine_logs(reports.iter().filter_map(|r| r.run.object.as_ref()))
            {
                summary["object"] = o;
            }
            summary["settings"]["storage"] = t.settings_json();
        }
        Ok(Some(summary))
    }

    /// Object storage: the layout the engine reads, each object one file of samples read
    /// in one request per sample (the library turns it into its GETs, s3_reads.rs), and
    /// the objects' sizes as listed.
    fn s3_layout(
        &self,
        target: &crate::object::s3_writes::S3Target,
        layout: &Layout,
        mine: &[usize],
        sizing: &str,
    ) -> Result<(Layout, u64)> {
        let have = target.dataset_objects(layout)?;
        target.verify(layout, mine, &have).map_err(|e| InputError(format!("{e:#} ({sizing})")))?;
        let spf = layout.samples_per_file.max(1);
        let files: Vec<dataset::DataFile> = layout
            .files
            .iter()
            .map(|f| dataset::DataFile { rel: f.rel.clone(), size: f.size, sample: (f.size / spf).max(1) })
            .collect();
        let largest = files.iter().map(|f| f.sample).max().unwrap_or(1);
        if largest > i32::MAX as u64 {
            bail!(InputError(format!(
                "{}: samples of {largest} bytes: object replay reads at most 2 GiB per request",
                self.source
            )));
        }
        Ok((Layout { files, format: crate::formats::Format::Raw, ..layout.clone() }, largest))
    }
}

/// `f`'s result with the scheduler's account of this rank's threads over it (client.rs).
fn metered<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, crate::engine::client::ClientCpu)> {
    let meter = crate::engine::client::Meter::start();
    let out = f()?;
    Ok((out, meter.finish()))
}

/// Runs `f`, with the process CPU seconds it took.
fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let cpu0 = cpu_seconds();
    let out = f()?;
    Ok((out, cpu_seconds() - cpu0))
}

fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => None,
        n if n % 2 == 1 => Some(s[n / 2]),
        n => Some((s[n / 2 - 1] + s[n / 2]) / 2.0),
    }
}

fn cpu_seconds() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
