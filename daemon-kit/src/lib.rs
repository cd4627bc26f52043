//! Plumbing shared by the Flyt daemons, written once: config loading with environment overrides
//! ([`config`]), what every `main` does ([`daemon`]), logging ([`logging`]), cluster-key
//! authentication ([`auth`]), the tarpc transport with its postcard codec ([`rpc`], [`codec`]),
//! crash-safe state files ([`fs`]), facts about this host ([`host`]), Prometheus metrics
//! endpoints ([`metrics`]) and fail points for crash tests ([`failpoint`]).
#![forbid(unsafe_code)]

pub mod auth;
pub mod codec;
pub mod config;
pub mod daemon;
pub mod failpoint;
pub mod fs;
pub mod host;
pub mod logging;
pub mod metrics;
pub mod rpc;
pub mod tls;
