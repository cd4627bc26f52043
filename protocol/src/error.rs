//! `cudaError_t` as data: a plain `u32` on the wire and across the C ABI, converted by lookup,
//! never transmuted. Names and messages are the CUDA 13 runtime's own (generated table), so an app
//! prints the same words through Flyt as natively.

use serde::{Deserialize, Serialize};

use crate::generated::cuda_errors::CUDA_ERRORS;

/// A failing `cudaError_t` (never `cudaSuccess`: success is `Ok`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CudaError(u32);

/// Result of a CUDA runtime operation.
pub type CudaResult<T> = Result<T, CudaError>;

macro_rules! error_constants {
    ($($name:ident = $code:literal,)*) => {
        impl CudaError {
            $(pub const $name: Self = Self($code);)*
        }
    };
}

error_constants! {
    INVALID_VALUE = 1,
    MEMORY_ALLOCATION = 2,
    INITIALIZATION_ERROR = 3,
    CUDART_UNLOADING = 4,
    INVALID_CONFIGURATION = 9,
    INVALID_PITCH_VALUE = 12,
    INVALID_SYMBOL = 13,
    INVALID_HOST_POINTER = 16,
    INVALID_DEVICE_POINTER = 17,
    INVALID_MEMCPY_DIRECTION = 21,
    INSUFFICIENT_DRIVER = 35,
    DEVICES_UNAVAILABLE = 46,
    MISSING_CONFIGURATION = 52,
    INVALID_DEVICE_FUNCTION = 98,
    NO_DEVICE = 100,
    INVALID_DEVICE = 101,
    DEVICE_UNINITIALIZED = 201, // the driver's CUDA_ERROR_INVALID_CONTEXT
    INVALID_KERNEL_IMAGE = 200,
    NO_KERNEL_IMAGE_FOR_DEVICE = 209,
    UNSUPPORTED_LIMIT = 215,
    INVALID_RESOURCE_HANDLE = 400,
    SYMBOL_NOT_FOUND = 500,
    NOT_READY = 600,
    ILLEGAL_ADDRESS = 700,
    LAUNCH_OUT_OF_RESOURCES = 701,
    PEER_ACCESS_ALREADY_ENABLED = 704,
    PEER_ACCESS_NOT_ENABLED = 705,
    HOST_MEMORY_ALREADY_REGISTERED = 712,
    HOST_MEMORY_NOT_REGISTERED = 713,
    CONTEXT_IS_DESTROYED = 709,
    LAUNCH_FAILURE = 719,
    ILLEGAL_STATE = 401,
    NOT_PERMITTED = 800,
    NOT_SUPPORTED = 801,
    OPERATING_SYSTEM = 304,
    STREAM_CAPTURE_UNSUPPORTED = 900,
    STREAM_CAPTURE_INVALIDATED = 901,
    STREAM_CAPTURE_UNMATCHED = 903,
    STREAM_CAPTURE_UNJOINED = 904,
    STREAM_CAPTURE_ISOLATION = 905,
    STREAM_CAPTURE_IMPLICIT = 906,
    GRAPH_EXEC_UPDATE_FAILURE = 910,
    CAPTURED_EVENT = 907,
    INVALID_RESOURCE_TYPE = 914,
    INVALID_RESOURCE_CONFIGURATION = 915,
    UNKNOWN = 999,
}

impl CudaError {
    /// Converts a raw `cudaError_t`; `0` (`cudaSuccess`) is `Ok(())`.
    pub fn check(code: u32) -> CudaResult<()> {
        match code {
            0 => Ok(()),
            code => Err(Self(code)),
        }
    }

    /// A raw `cudaError_t` that must be an error; `0` becomes `cudaErrorUnknown` rather than a
    /// success that was never reported.
    pub fn from_code(code: u32) -> Self {
        if code == 0 { Self::UNKNOWN } else { Self(code) }
    }

    /// Maps a driver `CUresult` to the runtime error the CUDA runtime reports for it. The runtime
    /// reuses the driver's numbers for every error both define (out of memory is 2 in both,
    /// illegal address 700 in both...); a driver code the runtime does not define is
    /// `cudaErrorUnknown`.
    pub fn from_driver(code: u32) -> Self {
        if code != 0 && lookup(code).is_some() { Self(code) } else { Self::UNKNOWN }
    }

    /// The raw `cudaError_t` value.
    pub fn code(self) -> u32 {
        self.0
    }

    /// `cudaGetErrorName` of this error.
    pub fn name(self) -> &'static str {
        name_of(self.0)
    }

    /// `cudaGetErrorString` of this error.
    pub fn message(self) -> &'static str {
        message_of(self.0)
    }
}

fn lookup(code: u32) -> Option<&'static (u32, &'static str, &'static str)> {
    CUDA_ERRORS.binary_search_by_key(&code, |entry| entry.0).ok().map(|index| &CUDA_ERRORS[index])
}

const UNRECOGNIZED: &str = "unrecognized error code";

/// `cudaGetErrorName` for any raw code, `cudaSuccess` included.
pub fn name_of(code: u32) -> &'static str {
    lookup(code).map_or(UNRECOGNIZED, |entry| entry.1)
}

/// `cudaGetErrorString` for any raw code, `cudaSuccess` included.
pub fn message_of(code: u32) -> &'static str {
    lookup(code).map_or(UNRECOGNIZED, |entry| entry.2)
}

impl std::fmt::Debug for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message(), self.name())
    }
}

impl std::error::Error for CudaError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_unique() {
        assert!(CUDA_ERRORS.windows(2).all(|pair| pair[0].0 < pair[1].0));
    }

    #[test]
    fn names_and_messages_match_the_runtime() {
        assert_eq!(CudaError::INVALID_VALUE.name(), "cudaErrorInvalidValue");
        assert_eq!(CudaError::INVALID_VALUE.message(), "invalid argument");
        assert_eq!(CudaError::ILLEGAL_ADDRESS.message(), "an illegal memory access was encountered");
        assert_eq!(name_of(0), "cudaSuccess");
        assert_eq!(message_of(123_456), "unrecognized error code");
    }

    #[test]
    fn every_constant_is_a_known_code() {
        for error in [
            CudaError::INVALID_VALUE,
            CudaError::DEVICES_UNAVAILABLE,
            CudaError::NOT_SUPPORTED,
            CudaError::INVALID_RESOURCE_HANDLE,
            CudaError::NO_KERNEL_IMAGE_FOR_DEVICE,
            CudaError::HOST_MEMORY_NOT_REGISTERED,
        ] {
            assert_ne!(error.name(), UNRECOGNIZED, "{}", error.code());
        }
    }

    #[test]
    fn driver_codes_map_by_number_or_to_unknown() {
        assert_eq!(CudaError::from_driver(2), CudaError::MEMORY_ALLOCATION);
        assert_eq!(CudaError::from_driver(700), CudaError::ILLEGAL_ADDRESS);
        assert_eq!(CudaError::from_driver(0), CudaError::UNKNOWN);
        assert_eq!(CudaError::from_driver(31_337), CudaError::UNKNOWN);
        assert_eq!(CudaError::check(0), Ok(()));
        assert_eq!(CudaError::from_code(0), CudaError::UNKNOWN);
    }
}
