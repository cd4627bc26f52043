//! `flyt-protocol`: every type that crosses a Flyt process boundary.
//!
//! - [`ops`]: the data-plane op table (`for_each_op!`), expanded here into request/reply types and
//!   their codec, and in the rpc-server into the handler trait every device backend implements.
//! - [`frame`]: the lean length-prefixed framing shared by shim, rpc-server and client manager.
//! - [`handshake`], [`device`], [`token`], [`locate`]: session set-up; [`deposit`]: a file the app
//!   maps, handed to its worker.
//! - [`error`]: `cudaError_t` as data, with the runtime's own names and messages.
//! - `control` (feature `control`): control-plane services (tarpc traits) between the daemons
//!   and `flytctl`; the libraries loaded into apps build without it, so they carry no async runtime.
//!
//! No I/O policy lives here: framing works over any `Read`/`Write`, and nothing touches CUDA.
#![forbid(unsafe_code)]
#![allow(
    clippy::cast_possible_truncation,
    reason = "Flyt runs on 64-bit Linux only: sizes and addresses cross the wire as u64 and fit usize"
)]

#[cfg(feature = "control")]
pub mod control;
pub mod deposit;
pub mod device;
pub mod error;
pub mod float_planes;
pub mod frame;
pub mod handshake;
pub mod jobs;
pub mod locate;
pub mod ops;
pub mod stripes;
pub mod token;
/// The listener's and its workers' messages (the server's; they name control-plane types).
#[cfg(feature = "control")]
pub mod worker;
mod generated {
    #[rustfmt::skip]
    pub(crate) mod cuda_errors;
}

pub use error::CudaError;
