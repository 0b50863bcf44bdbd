//! A trace set: the per-host traces of one multi-host job (SCHEMA.md, *Trace sets*).
//!
//! A set is a directory that holds no segment of its own and whose subdirectories are
//! traces, one per host (`trainio record --per-host -o SET` writes `SET/HOSTNAME/`). The
//! members are read as one job: each member's times are moved onto the first member's
//! clock by the two traces' `trainio.clock_offset_ns` (wall clock − CLOCK_MONOTONIC), so
//! an instant has the same time in every member.
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;

use crate::keys;
use crate::read::{is_segment_name, open_with_metadata, read_segment_batches, segment_paths, BatchOrigin, TraceError};

/// One host's trace in a set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// `trainio.hostname` of the trace.
    pub host: String,
    pub path: PathBuf,
    /// `trainio.clock_offset_ns` (0 when absent).
    pub clock_offset_ns: i64,
    /// Add to this member's times to put them on the set's clock (the first member's).
    pub shift_ns: i64,
    /// Whether the member's recording ended (1.9's `trainio.end`); `Some(false)`: its
    /// recorder was killed or its host lost, so its rows stop early. None before 1.9.
    pub complete: Option<bool>,
}

/// A member of a set as [`open_trace_set`] found it: its segments, the last one held open
/// (its metadata was read through it), so reading the member opens that file no more.
pub struct OpenMember {
    pub member: Member,
    segments: Vec<PathBuf>,
    last: File,
}

impl OpenMember {
    /// [`crate::read_batches`] of the member, its last segment read through the held file.
    pub fn read_batches(
        self,
        f: impl FnMut(&RecordBatch, &BatchOrigin) -> Result<(), TraceError>,
    ) -> Result<(), TraceError> {
        read_segment_batches(self.segments, Some(self.last), f)
    }
}

fn bad(path: &Path, what: impl std::fmt::Display) -> TraceError {
    TraceError(crate::one_line(&format!("{}: {what}", path.display())))
}

/// The members of a trace set in name order, or None when `path` is not a set (a file,
/// a directory with segments of its own, or one without a subdirectory). A set whose
/// members disagree is refused: a subdirectory that is not a trace, two members recorded
/// on the same host, members of different schema versions.
pub fn trace_set_members(path: &Path) -> Result<Option<Vec<Member>>, TraceError> {
    Ok(open_trace_set(path)?.map(|members| members.into_iter().map(|m| m.member).collect()))
}

/// [`trace_set_members`], each with its segments and its last segment held open.
pub fn open_trace_set(path: &Path) -> Result<Option<Vec<OpenMember>>, TraceError> {
    if !path.is_dir() {
        return Ok(None);
    }
    let entries = std::fs::read_dir(path).map_err(|e| bad(path, format!("cannot read: {e}")))?;
    let mut dirs = Vec::new();
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        let name = e.file_name();
        if name.to_str().is_some_and(is_segment_name) {
            return Ok(None); // a trace of its own
        }
        if p.is_dir() {
            dirs.push(p);
        }
    }
    if dirs.is_empty() {
        return Ok(None);
    }
    dirs.sort();
    let mut members: Vec<OpenMember> = Vec::new();
    let mut version: Option<(PathBuf, String)> = None;
    for dir in dirs {
        let segs = segment_paths(&dir).map_err(|_| {
            bad(
                path,
                format!("{} is not a trace (no seg-*.parquet): a trace set holds only per-host traces", dir.display()),
            )
        })?;
        let (last, meta) = open_with_metadata(segs.last().expect("a segment"))?;
        let host = meta.get(keys::HOSTNAME).map(|h| h.trim().to_string()).unwrap_or_default();
        if host.is_empty() {
            return Err(bad(&dir, "no trainio.hostname: a member of a trace set must name its host"));
        }
        let v = format!(
            "{}.{}",
            meta.get(keys::SCHEMA_VERSION).map(|s| s.trim()).unwrap_or("?"),
            meta.get(keys::SCHEMA_MINOR).map(|s| s.trim()).unwrap_or("0")
        );
        match &version {
            None => version = Some((dir.clone(), v)),
            Some((first, fv)) if *fv != v => {
                return Err(bad(
                    path,
                    format!(
                        "members of different schema versions: {} is {fv}, {} is {v} (record every host with the same trainio)",
                        first.display(),
                        dir.display()
                    ),
                ))
            }
            _ => {}
        }
        if let Some(other) = members.iter().map(|m| &m.member).find(|m| m.host == host) {
            return Err(bad(
                path,
                format!(
                    "{} and {} were both recorded on host {host}: one trace per host",
                    other.path.display(),
                    dir.display()
                ),
            ));
        }
        let clock_offset_ns = match meta.get(keys::CLOCK_OFFSET_NS) {
            None => 0,
            Some(v) => v.trim().parse::<i64>().map_err(|_| {
                bad(
                    &dir,
                    format!("{} {:?} is not an integer", keys::CLOCK_OFFSET_NS, v.chars().take(24).collect::<String>()),
                )
            })?,
        };
        let complete = crate::recording_complete(&meta);
        let member = Member { host, path: dir, clock_offset_ns, shift_ns: 0, complete };
        members.push(OpenMember { member, segments: segs, last });
    }
    let base = members[0].member.clock_offset_ns;
    for m in &mut members {
        m.member.shift_ns = m.member.clock_offset_ns.saturating_sub(base);
    }
    Ok(Some(members))
}
