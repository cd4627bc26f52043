//! Kernel launches: the configuration checked against the device's limits at
//! the call (as CUDA does, instead of failing later at a sync point), the arguments packed by the
//! kernel's parameter layout, and one asynchronous message: no round trip.

use std::ffi::c_void;
use std::sync::OnceLock;

use flyt_protocol::CudaError;
use flyt_protocol::device::{DeviceInfo, attr};
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{Dim3, FuncAttributes, LaunchAttribute, req};

use crate::client::Client;
use crate::registry::Function;

/// Where a launch's arguments are.
pub enum Args<'a> {
    /// `kernelParams`: for each parameter, a pointer to a value of its size (NULL for a kernel
    /// without parameters).
    Pointers(*mut *mut c_void),
    /// One buffer already laid out by the parameter layout (`CU_LAUNCH_PARAM_BUFFER_POINTER`).
    Packed(&'a [u8]),
}

/// A launch's geometry and where it goes. `stream` is a wire id (see `streams::resolve`).
pub struct Config {
    pub grid: Dim3,
    pub block: Dim3,
    pub shared_mem: usize,
    pub stream: u64,
    pub attributes: Vec<LaunchAttribute>,
}

/// What the device allows a launch.
struct Limits {
    max_block: [u32; 3],
    max_threads_per_block: u32,
    max_grid: [u32; 3],
    max_shared_mem: usize,
}

impl Limits {
    fn of(device: &DeviceInfo) -> Self {
        let get = |attribute| device.attribute(attribute).map_or(u32::MAX, |value| u32::try_from(value).unwrap_or(u32::MAX).max(1));
        Self {
            max_block: [get(attr::MAX_BLOCK_DIM_X), get(attr::MAX_BLOCK_DIM_Y), get(attr::MAX_BLOCK_DIM_Z)],
            max_threads_per_block: get(attr::MAX_THREADS_PER_BLOCK),
            max_grid: [get(attr::MAX_GRID_DIM_X), get(attr::MAX_GRID_DIM_Y), get(attr::MAX_GRID_DIM_Z)],
            max_shared_mem: get(attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) as usize,
        }
    }

    /// CUDA 13 refuses these at the call with an invalid value (measured on the GPU machine: 2048
    /// threads per block, grid y 65536, an empty grid and 1 MiB of dynamic shared memory).
    fn check(&self, config: &Config) -> CudaResult<()> {
        let within = |d: Dim3, max: [u32; 3]| d.x >= 1 && d.y >= 1 && d.z >= 1 && d.x <= max[0] && d.y <= max[1] && d.z <= max[2];
        let ok = within(config.block, self.max_block)
            && config.block.volume() <= u64::from(self.max_threads_per_block)
            && within(config.grid, self.max_grid)
            && config.shared_mem <= self.max_shared_mem;
        if ok { Ok(()) } else { Err(CudaError::INVALID_VALUE) }
    }
}

impl Client {
    /// Says once why kernels fail on a server whose device is emulated (it runs no GPU code), so a
    /// CI run that reaches a kernel reads why, not only an error code.
    pub fn note_unrunnable(&self, kernel: &str, error: CudaError) {
        if self.info.emulated {
            crate::diagnostics::once(
                "emulated-launch",
                &format!(
                    "flyt: the kernel {} did not run: the Flyt server's GPU is emulated (no GPU there: memory and copies work, kernels do not) ({error:?})",
                    readable_name(kernel)
                ),
            );
        }
    }

    fn limits(&self) -> CudaResult<&Limits> {
        static LIMITS: OnceLock<Option<Limits>> = OnceLock::new();
        LIMITS.get_or_init(|| self.device(0).as_ref().map(Limits::of)).as_ref().ok_or(CudaError::INVALID_DEVICE)
    }

    /// Launches `function`: checks the configuration, packs the arguments and queues the launch.
    ///
    /// # Safety
    /// `args` is what the driver API's `cuLaunchKernel` requires: with `Pointers`, for each kernel
    /// parameter, a readable pointer to a value of that parameter's size.
    pub unsafe fn launch(&self, function: &Function, config: Config, args: Args<'_>) -> CudaResult<()> {
        flyt_ring::timeline::mark(flyt_ring::timeline::Stage::LaunchEnter);
        self.limits()?.check(&config)?;
        if let Some(attribute) = config.attributes.iter().find(|a| !a.is_forwarded()) {
            crate::diagnostics::once(
                &format!("launch-attribute-{}", attribute.id),
                &format!("flyt: launch attribute {} is not supported (kernel {})", attribute.id, function.name),
            );
            return Err(CudaError::NOT_SUPPORTED);
        }
        // SAFETY: forwarded contract.
        let packed = unsafe { pack_args(function, args) }?;
        let shared_mem = u32::try_from(config.shared_mem).map_err(|_| CudaError::INVALID_VALUE)?;
        self.push_mirrors()?;
        self.post(req::Launch {
            function: function.reference(),
            grid: config.grid,
            block: config.block,
            shared_mem,
            stream: config.stream,
            args: packed,
            attributes: config.attributes,
        })
    }
}

impl Client {
    /// A kernel's attributes from the driver: asked once, then answered in the process until the
    /// app sets one.
    pub fn function_attributes(&self, function: &Function) -> CudaResult<FuncAttributes> {
        if let Some(attributes) = *lock(&function.attributes) {
            return Ok(attributes);
        }
        let attributes = self.call(req::FuncGetAttributes { function: function.reference() })?.attributes;
        *lock(&function.attributes) = Some(attributes);
        Ok(attributes)
    }

    /// `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`, asked of the server.
    pub fn max_active_blocks(&self, function: &Function, block_size: i32, dynamic_shared_mem: usize, flags: u32) -> CudaResult<i32> {
        let request = req::OccupancyMaxActiveBlocks {
            function: function.reference(),
            block_size,
            dynamic_shared_mem: dynamic_shared_mem as u64,
            flags,
        };
        Ok(self.call(request)?.blocks)
    }

    /// Sets a kernel attribute (`CUfunction_attribute` numbering, which `cudaFuncAttribute` shares)
    /// on the thread's device; a value this process set before is already there.
    pub fn set_function_attribute(&self, function: &Function, attribute: u32, value: i32) -> CudaResult<()> {
        let key = (crate::devices::thread_device(), attribute);
        if lock(&function.settings).get(&key) == Some(&value) {
            return Ok(());
        }
        let result = self.call(req::FuncSetAttribute { function: function.reference(), attribute, value }).map(|_| ());
        *lock(&function.attributes) = None;
        match result {
            Ok(()) => lock(&function.settings).insert(key, value),
            Err(_) => lock(&function.settings).remove(&key),
        };
        result
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A kernel's arguments packed by its parameter layout, as the server passes them to the driver.
///
/// # Safety
/// `args` is what the driver API's `cuLaunchKernel` requires: with `Pointers`, for each kernel
/// parameter, a readable pointer to a value of that parameter's size.
pub unsafe fn pack_args(function: &Function, args: Args<'_>) -> CudaResult<Vec<u8>> {
    let layout = &function.layout;
    Ok(match args {
        // The driver takes a buffer shorter than the parameters (NCCL passes the bytes of its
        // work arguments it filled, under a larger declared parameter): the rest reads as zeros.
        Args::Packed(buffer) => {
            let mut packed = buffer.get(..layout.args_len).unwrap_or(buffer).to_vec();
            packed.resize(layout.args_len, 0);
            packed
        }
        Args::Pointers(pointers) => {
            let mut packed = vec![0u8; layout.args_len];
            if !layout.params.is_empty() && pointers.is_null() {
                return Err(CudaError::INVALID_VALUE);
            }
            for (index, param) in layout.params.iter().enumerate() {
                // SAFETY: per this function's contract, `pointers[index]` points at
                // `param.size` readable bytes; the layout came from the driver for this kernel.
                let value = unsafe {
                    let source = *pointers.add(index);
                    if source.is_null() {
                        return Err(CudaError::INVALID_VALUE);
                    }
                    std::slice::from_raw_parts(source.cast::<u8>(), param.size as usize)
                };
                let offset = param.offset as usize;
                packed[offset..offset + value.len()].copy_from_slice(value);
            }
            packed
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use flyt_protocol::ops::ParamInfo;

    use super::*;
    use crate::registry::{Function, Layout};

    fn function(params: Vec<ParamInfo>) -> Function {
        Function {
            module: 1,
            index: 0,
            name: "k".into(),
            handle: 0,
            layout: Arc::new(Layout::new(params)),
            attributes: Mutex::new(None),
            settings: Default::default(),
        }
    }

    #[test]
    fn a_packed_buffer_is_cut_or_padded_to_the_parameters() {
        let kernel = function(vec![ParamInfo { offset: 0, size: 8 }, ParamInfo { offset: 8, size: 4096 }]);
        let head = [1u8; 20];
        // SAFETY: packed arguments are a plain slice.
        let packed = unsafe { pack_args(&kernel, Args::Packed(&head)) }.expect("a short buffer");
        assert_eq!(packed.len(), 8 + 4096);
        assert_eq!(&packed[..20], &head);
        assert!(packed[20..].iter().all(|byte| *byte == 0), "the rest reads as zeros");
        let long = vec![2u8; 5000];
        // SAFETY: as above.
        let packed = unsafe { pack_args(&kernel, Args::Packed(&long)) }.expect("a long buffer");
        assert_eq!(packed, vec![2u8; 8 + 4096]);
    }
}

/// A kernel's name as its source spells it (`vector_add(float const*, float*, int)`), not
/// mangled (`_Z10vector_addPKfPfi`); a name that is not a C++ symbol is kept as it is.
pub fn readable_name(symbol: &str) -> String {
    cpp_demangle::Symbol::new(symbol)
        .ok()
        .and_then(|parsed| parsed.demangle(&cpp_demangle::DemangleOptions::default()).ok())
        .unwrap_or_else(|| symbol.to_string())
}

#[cfg(test)]
mod name_tests {
    #[test]
    fn mangled_kernel_names_read_as_the_source_spells_them() {
        assert_eq!(super::readable_name("_Z10vector_addPKfS0_Pfi"), "vector_add(float const*, float const*, float*, int)");
        assert_eq!(super::readable_name("fake_kernel"), "fake_kernel");
    }
}
