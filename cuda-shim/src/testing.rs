//! A [`DeviceSource`] with made-up devices, for tests of everything that needs no server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use flyt_protocol::device::{DeviceInfo, HOPPER_LIMITS, attr};

use crate::driver::{DeviceSource, Unavailable};

/// How many fake devices the global driver of this crate's unit tests has.
pub const GLOBAL_FAKE_DEVICES: usize = 4;

/// `count` H100-like devices: device `i` has UUID bytes `i, 1, 2, ..., 15`, PCI `0000:(0x10+i):00.0` and
/// compute capability 9.0.
pub struct FakeDevices {
    pub devices: Vec<DeviceInfo>,
    pub driver_version: i32,
    /// How many times `open` ran.
    pub opened: Arc<AtomicUsize>,
}

impl FakeDevices {
    pub fn new(count: usize) -> FakeDevices {
        FakeDevices { devices: (0..count).map(fake_device).collect(), driver_version: 13000, opened: Arc::default() }
    }
}

/// One made-up device (see [`FakeDevices`]).
pub fn fake_device(index: usize) -> DeviceInfo {
    let mut uuid = [0u8; 16];
    for (i, byte) in uuid.iter_mut().enumerate() {
        *byte = i as u8;
    }
    uuid[0] = index as u8;
    let mut attributes = HOPPER_LIMITS.to_vec();
    attributes.extend([
        (attr::MULTIPROCESSOR_COUNT, 132),
        (attr::COMPUTE_CAPABILITY_MAJOR, 9),
        (attr::COMPUTE_CAPABILITY_MINOR, 0),
        (attr::PCI_DOMAIN_ID, 0),
        (attr::PCI_BUS_ID, 0x10 + index as i32),
        (attr::PCI_DEVICE_ID, 0),
    ]);
    attributes.sort_unstable();
    DeviceInfo { name: format!("Fake H100 {index}"), uuid, luid: [0; 8], luid_device_node_mask: 0, total_mem: 80 << 30, attributes }
}

impl DeviceSource for FakeDevices {
    fn driver_version(&self) -> i32 {
        self.driver_version
    }

    fn open(&self) -> Result<Vec<DeviceInfo>, Unavailable> {
        self.opened.fetch_add(1, Ordering::SeqCst);
        Ok(self.devices.clone())
    }
}
