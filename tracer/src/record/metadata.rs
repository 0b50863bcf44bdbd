//! What every segment says of the recording (SCHEMA.md, *Metadata*): the fixed facts taken
//! as it starts, and the counters, devices and NFS mounts read as each segment closes.
use std::collections::BTreeMap;

use serde_json::json;
use trainio_schema::{keys, SCHEMA_MINOR, SCHEMA_VERSION};

use crate::encoder::thread_cpu_ns;
use crate::events::Collector;
use crate::host;
use crate::probes::Probes;

use super::preflight::{Checked, Subject};

/// lost_events key: rows lost because a segment could not be written (a full disk).
pub(super) const WRITE_LOST: &str = "segment_write_failed";

/// Fixed facts of the recording, written into every segment.
pub(super) struct Static {
    pub(super) start_ns: i64,
    pub(super) layers: Vec<&'static str>,
    pub(super) target: serde_json::Value,
    pub(super) skipped: BTreeMap<String, String>,
    pub(super) selected_devs: Vec<String>,
    /// NFS mounts' mountstats when the recording started (empty without the nfs layer).
    pub(super) nfs_at_start: Option<Vec<host::NfsMountStats>>,
    /// The drain thread's CPU time once the probes were loaded and attached: what comes
    /// after is the recording's own cost.
    pub(super) drain_cpu_at_start: u64,
}

impl Static {
    /// Taken as the probes are attached: the layers they record (a layer whose probes were
    /// skipped is not), the subject, the devices asked for, the NFS mounts' counters.
    pub(super) fn new(checked: &Checked, probes: &Probes) -> Self {
        let mut layers = Vec::new();
        if checked.block && !probes.skipped.contains_key("block") {
            layers.push("block");
        }
        if checked.file {
            // proc and ipc are recorded by the file layer's probes.
            layers.extend(["file", "proc", "ipc"]);
        }
        if checked.nfs && !probes.skipped.contains_key("nfs") {
            layers.push("nfs");
        }
        if checked.object {
            layers.push("object");
        }
        let layers_has_nfs = layers.contains(&"nfs");
        Static {
            start_ns: host::monotonic_ns(),
            layers,
            target: match &checked.subject {
                Subject::Command(argv) => {
                    json!({"command": argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>()})
                }
                Subject::Pid(p) => json!({"pid": p}),
                Subject::Cgroup(c) => json!({"cgroup": c.display().to_string()}),
                Subject::All => json!({"all": true}),
            },
            skipped: probes.skipped.clone(),
            selected_devs: checked.devs.iter().map(|(d, _)| trainio_schema::dev_string(*d)).collect(),
            nfs_at_start: layers_has_nfs.then(host::nfs_mountstats),
            drain_cpu_at_start: thread_cpu_ns(),
        }
    }

    /// The drain thread's CPU time since the probes were attached (call it on that thread).
    pub(super) fn drain_cpu_ns(&self) -> u64 {
        thread_cpu_ns() - self.drain_cpu_at_start
    }
}

/// `trainio.nfs_mounts`: each NFS mount's identity from mountstats and mountinfo, and
/// its counters at the start of the recording and now (the segment's close).
fn nfs_mounts_json(at_start: &[host::NfsMountStats], now: &[host::NfsMountStats]) -> serde_json::Value {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for point in now.iter().chain(at_start).map(|m| m.mount_point.as_str()) {
        if !seen.insert(point) {
            continue;
        }
        let start = at_start.iter().rev().find(|m| m.mount_point == point);
        let close = now.iter().rev().find(|m| m.mount_point == point);
        let m = close.or(start).expect("point came from one of them");
        let nconnect = m
            .opts
            .split(',')
            .find_map(|o| o.strip_prefix("nconnect=").and_then(|n| n.parse::<u32>().ok()))
            .unwrap_or(1);
        out.push(json!({
            "dev": host::mount_dev(point),
            "mount_point": point,
            "source": m.source,
            "fstype": m.fstype,
            "statvers": m.statvers,
            "opts": m.opts,
            "nconnect": nconnect,
            "at_start": start.map(|s| &s.now),
            "at_close": close.map(|s| &s.now),
        }));
    }
    serde_json::Value::Array(out)
}

pub(super) fn segment_metadata(
    st: &Static,
    coll: &Collector,
    probes: &Probes,
    segment: u32,
    recorder_cpu_ns: (u64, u64),
    write_lost: u64,
    ended: Option<&str>,
) -> Vec<(String, String)> {
    let mut devs: Vec<&str> = coll.devices().collect();
    devs.extend(st.selected_devs.iter().map(String::as_str));
    devs.sort();
    devs.dedup();
    let mut events: BTreeMap<&str, u64> = BTreeMap::new();
    for ((layer, _), t) in &coll.tally() {
        *events.entry(layer.as_str()).or_default() += t.events;
    }
    let mut lost = probes.lost();
    if coll.undecodable > 0 {
        lost.insert("undecodable_records".into(), coll.undecodable);
    }
    if write_lost > 0 {
        lost.insert(WRITE_LOST.into(), write_lost);
    }
    vec![
        (keys::SCHEMA_VERSION.into(), SCHEMA_VERSION.into()),
        (keys::SCHEMA_MINOR.into(), SCHEMA_MINOR.into()),
        (keys::TRACER_VERSION.into(), env!("CARGO_PKG_VERSION").into()),
        (keys::HOSTNAME.into(), host::hostname()),
        (keys::KERNEL_RELEASE.into(), host::kernel_release()),
        (keys::CLOCK_OFFSET_NS.into(), host::clock_offset_ns().to_string()),
        (keys::START_NS.into(), st.start_ns.to_string()),
        (keys::END_NS.into(), host::monotonic_ns().to_string()),
        (keys::SEGMENT.into(), segment.to_string()),
        (keys::LAYERS.into(), json!(st.layers).to_string()),
        (keys::SKIPPED_PROBES.into(), json!(st.skipped).to_string()),
        (keys::TARGET.into(), st.target.to_string()),
        (keys::DEVICES.into(), json!(host::describe_devices(devs)).to_string()),
        (keys::LOST_EVENTS.into(), json!(lost).to_string()),
        (keys::BPF_STATS.into(), json!(probes.bpf_stats()).to_string()),
        (keys::EVENTS.into(), json!(events).to_string()),
        (keys::RECORDER_CPU_NS.into(), json!({"drain": recorder_cpu_ns.0, "encoder": recorder_cpu_ns.1}).to_string()),
        (
            keys::NFS_MOUNTS.into(),
            match &st.nfs_at_start {
                Some(start) => nfs_mounts_json(start, &host::nfs_mountstats()).to_string(),
                None => "[]".into(),
            },
        ),
        // Only the segment closed as the recording ends says it is complete: a trace
        // whose last segment says otherwise was cut off (SCHEMA.md, *The end of a recording*).
        (
            keys::END.into(),
            match ended {
                Some(reason) => json!({"complete": true, "reason": reason}),
                None => json!({"complete": false, "reason": "recording"}),
            }
            .to_string(),
        ),
    ]
}
