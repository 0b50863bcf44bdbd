# trainio: `make` builds everything into ./bin/trainio; `make test` runs every test.
SHELL := /bin/bash
# rustup's cargo, even when no login profile put it on PATH (CI runs without one).
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo
VENV := .venv
PY := $(VENV)/bin/python
# the interpreter pyo3 builds the analyzer's extension for (analysis/native)
export PYO3_PYTHON := $(CURDIR)/$(VENV)/bin/python

.PHONY: all deps build venv lint test test-fast reference bench-tracer bench-file bench-object bench-encode bench-analysis bench-replay bench-fidelity bench-realjob bench-formats bench-soak demo clean

all: build venv

deps:
	@scripts/install-deps.sh

# The analyzer's native kernels (analysis/native) are a Python extension built for the
# venv's interpreter and installed next to the package as trainio_analysis/_native.so.
NATIVE_SO := analysis/trainio_analysis/_native.so

build: deps
	$(CARGO) build --release --locked
	install -m 0755 target/release/libtrainio_analysis_native.so $(NATIVE_SO)

venv: deps

# The tests' S3 server: its own crate and lock file, built by deps into target/s3server.
S3SERVER := --manifest-path tests/s3server/Cargo.toml --target-dir target/s3server

# Rust format and clippy (rustfmt.toml; warnings are errors), Python lint and format (ruff.toml).
lint: all
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --locked --workspace --all-targets -- -D warnings
	$(CARGO) fmt --check --manifest-path tests/s3server/Cargo.toml
	$(CARGO) clippy --release --locked $(S3SERVER) --all-targets -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: all
	$(CARGO) test --release --locked --workspace
	$(CARGO) test --release --locked $(S3SERVER)
	$(PY) -m pytest tests

# docs/reference/COMMAND.md from every command's own parser, with the hand-written
# examples and notes of scripts/reference/COMMAND.md (tests/cli/test_reference.py fails on drift).
reference: build
	$(PY) scripts/gen-reference.py

# Tests that need neither root nor a device.
test-fast: all
	$(PY) -m pytest tests -m "not root and not slow"

bench-tracer: all
	$(PY) tests/bench/bench_tracer.py

# The file layer's cost to a process that reads with syscalls (4 KiB pread64 from page cache).
bench-file: all
	$(PY) tests/bench/bench_file.py

# The object layer's cost to a process that talks HTTP and HTTPS (GETs over keep-alive, 5 settings).
bench-object: all
	$(PY) tests/bench/bench_object.py

# The recorder's user-space CPU per row (building Arrow batches, encoding Parquet) on
# synthetic block rows: no root, no device, and steadier than IOPS for comparing encoders.
bench-encode:
	cargo run --release --locked -p trainio-schema --example encode_bench

bench-analysis: all
	$(PY) tests/bench/bench_analysis.py

# 288 simulated GPUs in one rank (CPU per GPU-step, sleep overshoot), and the replayer vs fio.
bench-replay: all
	$(PY) tests/bench/bench_replay.py

# Replay fidelity (issue #6): record at 1, 4, 8 GPUs, replay at the same count, print the
# scores (throughput ratio, AU, queue-depth W1, request sizes). Needs root.
bench-fidelity: all
	$(PY) tests/bench/bench_fidelity.py

# Format x loader faithfulness (#21): the real reader (numpy.load, TensorFlow's TFRecord
# reads) and the replay's emulation on the same files: request sizes, QD, throughput and
# compare's W1 scores. Needs root.
bench-formats: all
	$(PY) tests/bench/bench_formats.py

# A recorder that stays on (#33): the 4 KiB block bench's rate recorded with retention and
# metrics for SOAK_S seconds (default 3600); RSS, CPU per event, segments kept and lost
# events every SOAK_EVERY_S (60). Needs root.
bench-soak: all
	$(PY) tests/bench/bench_soak.py

# A real PyTorch job (DataLoader workers, npz/raw, buffered/O_DIRECT) compute- and
# storage-bound: the job model inferred from its trace and its replay against the job's
# own figures (issue #18). Needs root.
bench-realjob: all
	$(PY) tests/bench/bench_realjob.py

# README command one: a loop device throttled to stand for a 200 MiB/s drive, a recorded
# emulated training, analysis, report, replay at 4 GPUs, fidelity and a sweep that names
# the GPU count where AU falls below 90%. Needs root.
demo: all
	scripts/demo.sh

clean:
	$(CARGO) clean
	rm -f $(NATIVE_SO)
	rm -rf $(VENV)
