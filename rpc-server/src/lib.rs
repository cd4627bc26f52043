//! `flyt-rpc-server`: one listening server per GPU slice. Each session's GPU work runs in a
//! worker process of its own (a fatal kernel fault poisons every CUDA context of its process),
//! against a `Device` backend: the CUDA driver, or the emulated host-memory device.
#![allow(
    clippy::cast_possible_truncation,
    reason = "Flyt runs on 64-bit Linux only: sizes and addresses cross the wire as u64 and fit usize"
)]

pub mod activity;
pub mod address_space;
pub mod backend;
pub mod budget;
pub mod config;
pub mod control;
pub mod host_calls;
pub mod images;
pub mod listener;
pub mod memory;
pub mod metrics;
pub mod output;
pub mod page_pool;
pub mod paging;
pub mod reconnect;
pub mod session;
pub mod shareable;
pub mod shm;
pub mod stats;
pub mod stripes;
pub mod transport;
pub mod visible;
pub mod waiters;
pub mod worker;
