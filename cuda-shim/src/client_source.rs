//! The driver's devices from the client core: the process's one `flyt-client` session, opened at
//! the first call that needs the devices (never by `cuInit`), and the mapping of the session's
//! errors (CUDA runtime numbering) to driver status codes.

use flyt_protocol::CudaError;
use flyt_protocol::device::DeviceInfo;

use crate::CUresult;
use crate::driver::{DeviceSource, Unavailable};
use crate::generated::proc_address::MAX_VERSION;

/// Devices of the session with a GPU server.
pub struct ClientDevices;

impl DeviceSource for ClientDevices {
    /// The newest version this library's tables serve until a session is open; then the server's
    /// driver version when it is older (a program then sees what the remote driver can run).
    fn driver_version(&self) -> i32 {
        flyt_client::client::existing_client().map_or(MAX_VERSION, |client| client.driver_version().clamp(1000, MAX_VERSION))
    }

    fn open(&self) -> Result<Vec<DeviceInfo>, Unavailable> {
        // No server to reach is no device, as a machine without a GPU answers.
        let client = flyt_client::client::client().map_err(|error| Unavailable {
            result: if error == CudaError::DEVICES_UNAVAILABLE { CUresult::CUDA_ERROR_NO_DEVICE } else { to_driver(error) },
            reason: format!("the session with the GPU server did not open ({error})"),
        })?;
        Ok((0..client.device_count()).filter_map(|index| client.device(index)).collect())
    }
}

/// A session error as the driver reports it. Most codes are the same in both numberings; the
/// runtime-only ones become the driver's nearest (a bad pointer or direction is an invalid value).
pub fn to_driver(error: CudaError) -> CUresult {
    match error {
        CudaError::INVALID_MEMCPY_DIRECTION
        | CudaError::INVALID_DEVICE_POINTER
        | CudaError::INVALID_HOST_POINTER
        | CudaError::INVALID_SYMBOL
        | CudaError::INVALID_CONFIGURATION
        | CudaError::MISSING_CONFIGURATION => CUresult::CUDA_ERROR_INVALID_VALUE,
        CudaError::INVALID_DEVICE_FUNCTION => CUresult::CUDA_ERROR_INVALID_HANDLE,
        CudaError::INITIALIZATION_ERROR => CUresult::CUDA_ERROR_NOT_INITIALIZED,
        CudaError::CUDART_UNLOADING => CUresult::CUDA_ERROR_DEINITIALIZED,
        other => {
            let code = CUresult(other.code());
            if crate::generated::errors::ERRORS.binary_search_by_key(&code.0, |e| e.0).is_ok() {
                code
            } else {
                CUresult::CUDA_ERROR_UNKNOWN
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_only_codes_map_to_driver_codes() {
        assert_eq!(to_driver(CudaError::INVALID_MEMCPY_DIRECTION), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(to_driver(CudaError::MEMORY_ALLOCATION), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(to_driver(CudaError::DEVICES_UNAVAILABLE), CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE);
        assert_eq!(to_driver(CudaError::INVALID_RESOURCE_HANDLE), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(to_driver(CudaError::NOT_READY), CUresult::CUDA_ERROR_NOT_READY);
    }
}
