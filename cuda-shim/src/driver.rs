//! The driver's process-wide state: where devices come from ([`DeviceSource`]), what `cuInit` learned
//! ([`Session`]), the contexts, and teardown.
//!
//! The exported functions use one global [`Driver`] ([`driver`]); tests build their own with a fake source.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use flyt_protocol::device::DeviceInfo;

use crate::CUresult;
use crate::context::Contexts;
use crate::ffi::DriverResult;

/// Why a source has no devices to offer: the status `cuInit` returns and one line for the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable {
    pub result: CUresult,
    pub reason: String,
}

/// Where the driver's devices come from: the client core (a session with a GPU server) implements it.
///
/// Both methods are called from inside the driver API, so they must not call back into it.
pub trait DeviceSource: Send + Sync {
    /// The version `cuDriverGetVersion` reports (e.g. 13000). Called before `cuInit`, from
    /// `cuGetProcAddress` and from the integrity check, so it must be cheap, never connect anywhere, and
    /// return the same value for the life of the process.
    fn driver_version(&self) -> i32;

    /// Called once, by the first call after `cuInit` that needs the devices (`cuInit` itself never
    /// connects anywhere): the devices this process will see, fixed from then on (device queries are
    /// answered from them without further calls). An error is returned by that call and every later
    /// one that needs the devices.
    fn open(&self) -> Result<Vec<DeviceInfo>, Unavailable>;
}

/// The source used when nothing else was installed: no devices, with a reason.
pub struct NoDevices;

impl DeviceSource for NoDevices {
    fn driver_version(&self) -> i32 {
        crate::generated::proc_address::MAX_VERSION
    }

    fn open(&self) -> Result<Vec<DeviceInfo>, Unavailable> {
        Err(Unavailable {
            result: CUresult::CUDA_ERROR_NO_DEVICE,
            reason: "no GPU server is connected to this process (this libcuda.so.1 only answers in-process \
                     queries so far)"
                .to_string(),
        })
    }
}

/// What a successful `cuInit` fixed for the process.
pub struct Session {
    pub devices: Vec<DeviceInfo>,
}

impl Session {
    /// The device with ordinal `device`, or CUDA_ERROR_INVALID_DEVICE.
    pub fn device(&self, device: i32) -> DriverResult<&DeviceInfo> {
        usize::try_from(device).ok().and_then(|d| self.devices.get(d)).ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
    }
}

/// The driver's state; see the module docs.
pub struct Driver {
    source: Box<dyn DeviceSource>,
    /// `cuInit` succeeded (the devices are opened later, on first need).
    initialized: AtomicBool,
    session: OnceLock<Result<Arc<Session>, CUresult>>,
    /// Serialises the first `cuInit` so `open` runs once.
    opening: Mutex<()>,
    pub(crate) contexts: Contexts,
    torn_down: AtomicBool,
}

impl Driver {
    pub fn new(source: Box<dyn DeviceSource>) -> Driver {
        Driver {
            source,
            initialized: AtomicBool::new(false),
            session: OnceLock::new(),
            opening: Mutex::new(()),
            contexts: Contexts::default(),
            torn_down: AtomicBool::new(false),
        }
    }

    /// `cuInit(0)`: marks the driver initialized. Nothing is opened here: a process that only
    /// initializes (a compile worker, a data-loader worker) costs the GPU server nothing.
    pub fn init(&self) -> DriverResult {
        self.alive()?;
        self.initialized.store(true, Ordering::Release);
        Ok(())
    }

    /// Opens the source the first time; later calls return the first answer.
    fn open(&self) -> DriverResult<&Session> {
        let _guard = self.opening.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let outcome = self.session.get_or_init(|| match self.source.open() {
            Ok(devices) => {
                self.contexts.create_primaries(devices.len());
                Ok(Arc::new(Session { devices }))
            }
            Err(unavailable) => {
                crate::diagnostics::once("open", &format!("flyt: no devices: {}", unavailable.reason));
                Err(unavailable.result)
            }
        });
        outcome.as_deref().map_err(|code| *code)
    }

    /// The session, for calls that need `cuInit` to have succeeded: opened on the first such call.
    pub fn session(&self) -> DriverResult<&Session> {
        self.alive()?;
        // An app host function (run by a stream) may make no CUDA call, as with the driver.
        if flyt_client::graphs::in_host_function() {
            return Err(CUresult::CUDA_ERROR_NOT_PERMITTED);
        }
        if let Some(Ok(session)) = self.session.get() {
            return Ok(session);
        }
        if !self.initialized.load(Ordering::Acquire) {
            return Err(CUresult::CUDA_ERROR_NOT_INITIALIZED);
        }
        self.open()
    }

    /// The session if `cuInit` succeeded, without failing otherwise (the integrity check hashes zero
    /// devices before that).
    pub fn session_if_open(&self) -> Option<&Session> {
        match self.session.get() {
            Some(Ok(session)) => Some(session),
            _ => None,
        }
    }

    pub fn driver_version(&self) -> i32 {
        self.source.driver_version()
    }

    /// CUDA_ERROR_DEINITIALIZED once [`Driver::tear_down`] ran.
    pub fn alive(&self) -> DriverResult {
        if self.torn_down.load(Ordering::Acquire) { Err(CUresult::CUDA_ERROR_DEINITIALIZED) } else { Ok(()) }
    }

    /// From now on every call that needs state answers CUDA_ERROR_DEINITIALIZED at once (library unload or
    /// process exit: the runtime's own teardown still calls in, and must not block).
    pub fn tear_down(&self) {
        self.torn_down.store(true, Ordering::Release);
    }
}

static SOURCE: Mutex<Option<Box<dyn DeviceSource>>> = Mutex::new(None);
static DRIVER: OnceLock<Driver> = OnceLock::new();

/// Installs the source the process's driver will use. Must happen before the first driver call;
/// afterwards it returns the source back as an error.
pub fn install_device_source(source: Box<dyn DeviceSource>) -> Result<(), Box<dyn DeviceSource>> {
    if DRIVER.get().is_some() {
        return Err(source);
    }
    let mut slot = SOURCE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    *slot = Some(source);
    Ok(())
}

/// The process's driver: created on first use, cheaply (no connection), with the installed source or
/// [`NoDevices`] (in this crate's unit tests: [`crate::testing::FakeDevices`], so the exported functions
/// can be tested with devices).
pub fn driver() -> &'static Driver {
    DRIVER.get_or_init(|| {
        let installed = SOURCE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        Driver::new(installed.unwrap_or_else(default_source))
    })
}

#[cfg(not(test))]
fn default_source() -> Box<dyn DeviceSource> {
    Box::new(crate::client_source::ClientDevices)
}

#[cfg(test)]
fn default_source() -> Box<dyn DeviceSource> {
    Box::new(crate::testing::FakeDevices::new(crate::testing::GLOBAL_FAKE_DEVICES))
}

/// The library's unload hook (see the cdylib crate).
pub fn on_unload() {
    if let Some(driver) = DRIVER.get() {
        driver.tear_down();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeDevices;

    #[test]
    fn no_devices_fails_at_the_first_query_and_stays_failed() {
        let driver = Driver::new(Box::new(NoDevices));
        assert_eq!(driver.session().err(), Some(CUresult::CUDA_ERROR_NOT_INITIALIZED));
        assert_eq!(driver.init(), Ok(()));
        assert_eq!(driver.session().err(), Some(CUresult::CUDA_ERROR_NO_DEVICE));
        assert_eq!(driver.session().err(), Some(CUresult::CUDA_ERROR_NO_DEVICE));
    }

    #[test]
    fn the_source_opens_once_at_the_first_query_not_at_init() {
        let fake = FakeDevices::new(2);
        let opened = fake.opened.clone();
        let driver = Driver::new(Box::new(fake));
        assert_eq!(driver.session().err(), Some(CUresult::CUDA_ERROR_NOT_INITIALIZED));
        driver.init().unwrap();
        driver.init().unwrap();
        assert_eq!(opened.load(Ordering::SeqCst), 0, "cuInit opens nothing");
        assert_eq!(driver.session().unwrap().devices.len(), 2);
        assert_eq!(driver.session().unwrap().devices.len(), 2);
        assert_eq!(opened.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn after_tear_down_calls_answer_deinitialized() {
        let driver = Driver::new(Box::new(FakeDevices::new(1)));
        driver.init().unwrap();
        driver.tear_down();
        assert_eq!(driver.init(), Err(CUresult::CUDA_ERROR_DEINITIALIZED));
        assert_eq!(driver.session().err(), Some(CUresult::CUDA_ERROR_DEINITIALIZED));
    }
}
