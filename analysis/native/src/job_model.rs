//! The job model (crate `trainio-model`) from rows the analyzer decoded: the extension
//! opens no trace file. The rows come either as an Arrow C stream per trace, read here to
//! its end, or pushed batch by batch into a [`ModelRows`] by the analyzer's own pass, so
//! a trace that the analyzer decodes for its statistics is not decoded again for its model.

use std::path::PathBuf;

use arrow_array::ffi_stream::{FFI_ArrowArrayStream, RecordBatchStreamReader};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// The job model of a trace (crate `trainio-model`, the one `trainio replay --trace`
/// uses), as JSON: GPUs found, their steps, compute time and throughput need. It is built
/// from the rows the analyzer read, not from the trace's files: `parts` is the trace's one
/// `(name, None, rows)`, or a set's members' `(name, (host, shift_ns), rows)` in member
/// order, where `rows` is either a [`ModelRows`] the analyzer filled, or an Arrow C stream
/// (an object with `__arrow_c_stream__`, such as a `pyarrow.RecordBatchReader`) of every
/// row of the trace, checked as SCHEMA.md's *Readers* section says. `grouping` is `auto`,
/// `process` or a comma-separated list of rank pids; `step_gap_ms` None lets the model
/// find the gap between batches. `gpus_per_process` and `compute_scale` are the model's
/// what-ifs (crate `trainio-model`, whatif.rs), as `replay --trace` takes them. Raises
/// ValueError with a one-line message.
#[pyfunction]
#[pyo3(signature = (parts, grouping = "auto", step_gap_ms = None, gpus_per_process = None, compute_scale = None))]
pub fn job_model(
    py: Python<'_>,
    parts: Vec<RowsPart<'_>>,
    grouping: &str,
    step_gap_ms: Option<f64>,
    gpus_per_process: Option<u32>,
    compute_scale: Option<f64>,
) -> PyResult<String> {
    let grouping = trainio_model::Grouping::parse(grouping).map_err(PyValueError::new_err)?;
    let opts =
        trainio_model::Options { grouping, burst_gap_ms: step_gap_ms, gpus_per_process, compute_scale, dev: None };
    let mut sources = Vec::with_capacity(parts.len());
    for (name, member, rows) in parts {
        let rows = match rows.cast::<ModelRows>() {
            Ok(pushed) => Rows::Pushed(Box::new(pushed.borrow_mut().take()?)),
            Err(_) => Rows::Stream(import_stream(&rows)?),
        };
        sources.push((PathBuf::from(name), member, rows));
    }
    py.detach(|| {
        let parts = sources.into_iter().map(|(name, member, rows)| {
            let input = match rows {
                Rows::Pushed(rows) => (*rows).finish(),
                Rows::Stream(stream) => {
                    let mut rows = Pushed::default();
                    rows.push_stream(&name, stream)?;
                    rows.finish()
                }
            };
            Ok(trainio_model::Part { name, member, input })
        });
        trainio_model::infer_parts(parts, &opts).map(|m| trainio_model::to_json(&m))
    })
    .map_err(PyValueError::new_err)
}

/// One trace of [`job_model`]'s `parts`: its name, a set member's (host, shift_ns), its rows.
type RowsPart<'py> = (String, Option<(String, i64)>, Bound<'py, PyAny>);

enum Rows {
    Pushed(Box<Pushed>),
    Stream(RecordBatchStreamReader),
}

/// The model's input of one trace, built from batches as they arrive.
#[derive(Default)]
struct Pushed {
    input: trainio_model::InputBuilder,
    /// The first row of the next batch in the trace's rows (for messages).
    first_row: usize,
}

impl Pushed {
    fn push_stream(&mut self, name: &std::path::Path, rows: RecordBatchStreamReader) -> Result<(), String> {
        for batch in rows {
            let batch =
                batch.map_err(|e| format!("{}: {}", name.display(), trainio_schema::one_line(&e.to_string())))?;
            let origin = trainio_schema::BatchOrigin::checked(name, self.first_row);
            self.input.push(&batch, &origin).map_err(|e| e.to_string())?;
            self.first_row += batch.num_rows();
        }
        Ok(())
    }

    fn finish(self) -> trainio_model::Input {
        self.input.finish()
    }
}

/// A trace's rows for the job model, pushed by the analyzer as its pass decodes them
/// (`push`, in the trace's order) and handed to [`job_model`] in place of a stream. Rows
/// of every layer go in; the model keeps the file, proc, ipc and object rows and sums
/// the block layer as they arrive, so no batch is held after its push.
#[pyclass(module = "trainio_analysis._native")]
pub struct ModelRows {
    name: PathBuf,
    rows: Option<Pushed>,
}

#[pymethods]
impl ModelRows {
    /// `name`: the trace, for messages.
    #[new]
    fn new(name: String) -> Self {
        ModelRows { name: PathBuf::from(name), rows: Some(Pushed::default()) }
    }

    /// Adds the rows of `rows` (an object with `__arrow_c_stream__`, such as a
    /// `pyarrow.Table`, in the analyzer's row schema); the GIL is released meanwhile.
    fn push(&mut self, py: Python<'_>, rows: Bound<'_, PyAny>) -> PyResult<()> {
        let stream = import_stream(&rows)?;
        let name = &self.name;
        let Some(pushed) = self.rows.as_mut() else {
            return Err(PyValueError::new_err(format!("{}: rows pushed after the model was built", name.display())));
        };
        py.detach(|| pushed.push_stream(name, stream)).map_err(PyValueError::new_err)
    }
}

impl ModelRows {
    fn take(&mut self) -> PyResult<Pushed> {
        self.rows
            .take()
            .ok_or_else(|| PyValueError::new_err(format!("{}: these rows made a model already", self.name.display())))
    }
}

/// The Arrow C stream `obj` exports (`__arrow_c_stream__`), taken over: its batches are
/// read here and released when done.
fn import_stream(obj: &Bound<'_, PyAny>) -> PyResult<RecordBatchStreamReader> {
    let capsule = obj.call_method0("__arrow_c_stream__")?;
    let capsule = capsule.cast_into::<PyCapsule>()?;
    let raw = capsule.pointer_checked(Some(c"arrow_array_stream"))?;
    // SAFETY: a capsule named arrow_array_stream holds an ArrowArrayStream (the Arrow
    // PyCapsule interface); from_raw moves it out and leaves a released one behind, so
    // the capsule's destructor does not release it again.
    let stream = unsafe { FFI_ArrowArrayStream::from_raw(raw.as_ptr().cast::<FFI_ArrowArrayStream>()) };
    RecordBatchStreamReader::try_new(stream).map_err(|e| PyValueError::new_err(format!("rows stream: {e}")))
}
