//! Object storage (S3): object_store.rs reads a workload's object-storage settings,
//! s3_client.rs speaks to the endpoint, s3_reads.rs is the engine's backend that reads
//! samples, and s3_writes.rs does everything outside the read loop (the preflight check,
//! listing, datagen's objects, checkpoint shards).

pub mod object_store;
pub mod s3_client;
pub mod s3_reads;
pub mod s3_writes;
