//! `flyt-client`: the client core, one per process. The session with a `flyt-rpc-server` (opened
//! on the first call that needs the GPU), its connection and shared-memory channel, the registries
//! of what the app registered and allocated, deferred errors, and per-call statistics.
//!
//! No C exports: the fronts (Flyt's `libcuda.so.1` in `flyt-cuda`, Flyt's `libcudart.so.13` in
//! `flyt-cudart`) turn their ABIs into calls on the one [`client::Client`] of the process
//! ([`client::client`]).
#![allow(
    clippy::cast_possible_truncation,
    reason = "Flyt runs on 64-bit Linux only: sizes and addresses cross the wire as u64 and fit usize"
)]

pub mod arrays;

/// The client's handle maps (streams, events, allocations' chunks...), looked up on every call
/// that names one: keys are ids, hashed quickly (SipHash was a tenth of an async call's cost).
pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub mod client;
pub use flyt_front_kit::diagnostics;
pub mod conn;
pub mod devices;
pub mod graphs;
pub mod green;
pub mod host_files;
pub mod images;
pub mod ipc;
pub mod launch;
pub mod link;
pub mod managed;
pub mod mirrors;
pub mod ranges;
mod reconnect;
pub mod registry;
pub mod shaped;
pub mod shm;
pub mod stats;
pub mod streams;
pub mod stripes;
pub mod transfer;
pub mod user_objects;
pub mod vmm;
