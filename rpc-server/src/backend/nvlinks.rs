//! The session GPUs' NVLinks, from the host's NVML (NVIDIA's `libnvidia-ml.so.1`, loaded once at
//! run time): which of each GPU's links carry peer traffic and what each reaches, named as the
//! session may know it (`NvLinkEnd`). The driver API has no call for this, and NCCL chooses P2P
//! over host memory only when NVML shows the links. No NVML, or an error: no links, one log line.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use flyt_protocol::device::NvLinkEnd;

/// `(domain, bus, device)` of a PCI function.
pub type PciAddress = (u32, u32, u32);

/// `NVML_NVLINK_MAX_LINKS`.
const MAX_LINKS: c_uint = 18;
const NVML_SUCCESS: c_uint = 0;
/// `NVML_FEATURE_ENABLED`.
const ENABLED: c_uint = 1;
/// `NVML_NVLINK_CAP_P2P_SUPPORTED`.
const CAP_P2P_SUPPORTED: c_uint = 0;
/// `nvmlIntNvLinkDeviceType_t`: `NVML_NVLINK_DEVICE_TYPE_GPU`.
const DEVICE_TYPE_GPU: c_uint = 0;

/// `nvmlPciInfo_t` as `_v2`/`_v3` calls fill it.
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

type Handle = *mut c_void;

/// `nvmlFieldValue_t`.
#[repr(C)]
struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: c_uint,
    /// `nvmlValue_t`, 8 bytes; `uiVal` is its first 4 (little-endian).
    value: u64,
}

/// `NVML_FI_DEV_NVLINK_LINK_COUNT`.
const FI_DEV_NVLINK_LINK_COUNT: c_uint = 91;

struct Nvml {
    handle_by_pci_bus_id: unsafe extern "C" fn(*const c_char, *mut Handle) -> c_uint,
    link_state: unsafe extern "C" fn(Handle, c_uint, *mut c_uint) -> c_uint,
    link_capability: unsafe extern "C" fn(Handle, c_uint, c_uint, *mut c_uint) -> c_uint,
    remote_pci_info: unsafe extern "C" fn(Handle, c_uint, *mut PciInfo) -> c_uint,
    remote_device_type: Option<unsafe extern "C" fn(Handle, c_uint, *mut c_uint) -> c_uint>,
    field_values: Option<unsafe extern "C" fn(Handle, c_int, *mut FieldValue) -> c_uint>,
    _library: libloading::Library,
}

// SAFETY: plain function pointers into a library that stays loaded; NVML is thread-safe.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();

fn load() -> Result<Nvml, String> {
    // SAFETY: NVIDIA's NVML, whose initializers only attach to the driver; each symbol is looked
    // up by its documented name and given its documented C signature (enums as `unsigned`, which
    // share their ABI; handles as pointers).
    unsafe {
        let lib = libloading::Library::new("libnvidia-ml.so.1").map_err(|error| format!("libnvidia-ml.so.1: {error}"))?;
        let init: unsafe extern "C" fn() -> c_uint = required_symbol!(lib, "nvmlInit_v2");
        let status = init();
        if status != NVML_SUCCESS {
            return Err(format!("nvmlInit_v2 failed ({status})"));
        }
        Ok(Nvml {
            handle_by_pci_bus_id: required_symbol!(lib, "nvmlDeviceGetHandleByPciBusId_v2"),
            link_state: required_symbol!(lib, "nvmlDeviceGetNvLinkState"),
            link_capability: required_symbol!(lib, "nvmlDeviceGetNvLinkCapability"),
            remote_pci_info: required_symbol!(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2"),
            remote_device_type: optional_symbol!(lib, "nvmlDeviceGetNvLinkRemoteDeviceType"),
            field_values: optional_symbol!(lib, "nvmlDeviceGetFieldValues"),
            _library: lib,
        })
    }
}

/// What NVML says of one link that exists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawLink {
    /// Peer traffic may use it (`NVML_NVLINK_CAP_P2P_SUPPORTED`) and it is up.
    pub p2p_active: bool,
    /// The far end's PCI address, where NVML tells it.
    pub remote: Option<PciAddress>,
    /// NVML says the far end is a GPU.
    pub remote_is_gpu: bool,
    /// The far end's address is a GPU of this host (NVML has a handle for it).
    pub remote_is_host_gpu: bool,
}

/// Names a link's far end for a session whose GPUs are at `session` (in its device order).
pub fn classify(session: &[PciAddress], link: &RawLink) -> NvLinkEnd {
    if !link.p2p_active {
        return NvLinkEnd::Inactive;
    }
    // NCCL skips a link whose far end NVML cannot place; so does the session.
    let Some(remote) = link.remote else { return NvLinkEnd::Inactive };
    match session.iter().position(|address| *address == remote) {
        Some(index) => NvLinkEnd::Device(index as u32),
        // Another tenant's GPU: its existence and bus id stay unknown to this one.
        None if link.remote_is_gpu || link.remote_is_host_gpu => NvLinkEnd::Inactive,
        None => NvLinkEnd::Switch,
    }
}

fn bus_id_text((domain, bus, device): PciAddress) -> Vec<u8> {
    format!("{domain:08x}:{bus:02x}:{device:02x}.0\0").into_bytes()
}

impl Nvml {
    fn handle(&self, address: PciAddress) -> Option<Handle> {
        let text = bus_id_text(address);
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: a NUL-terminated bus id and a valid out-pointer.
        let status = unsafe { (self.handle_by_pci_bus_id)(text.as_ptr().cast(), &mut handle) };
        (status == NVML_SUCCESS).then_some(handle)
    }

    /// Link `link` of `device`, or `None` where the device has no such link.
    fn link(&self, device: Handle, link: c_uint) -> Option<RawLink> {
        // Asked in NCCL's order: the capability query trains the link before its state is read.
        let mut p2p: c_uint = 0;
        // SAFETY: a handle NVML gave and a valid out-pointer, here and below.
        let p2p = unsafe { (self.link_capability)(device, link, CAP_P2P_SUPPORTED, &mut p2p) } == NVML_SUCCESS && p2p != 0;
        let mut state: c_uint = 0;
        // SAFETY: as above.
        if unsafe { (self.link_state)(device, link, &mut state) } != NVML_SUCCESS {
            return None;
        }
        let p2p_active = p2p && state == ENABLED;
        if !p2p_active {
            return Some(RawLink::default());
        }
        // SAFETY: an all-zero `nvmlPciInfo_t` is valid.
        let mut pci: PciInfo = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let status = unsafe { (self.remote_pci_info)(device, link, &mut pci) };
        let remote = (status == NVML_SUCCESS).then_some((pci.domain, pci.bus, pci.device));
        let remote_is_gpu = self.remote_device_type.is_some_and(|remote_device_type| {
            let mut kind: c_uint = u32::MAX;
            // SAFETY: as above.
            let status = unsafe { remote_device_type(device, link, &mut kind) };
            status == NVML_SUCCESS && kind == DEVICE_TYPE_GPU
        });
        let remote_is_host_gpu = remote.is_some_and(|address| self.handle(address).is_some());
        Some(RawLink { p2p_active, remote, remote_is_gpu, remote_is_host_gpu })
    }

    /// Every link of the GPU at `address`, by index, up to its last one that exists.
    /// `NVML_FI_DEV_NVLINK_LINK_COUNT` of `device`, where NVML tells it.
    fn link_count(&self, device: Handle) -> Option<c_uint> {
        let field_values = self.field_values?;
        // SAFETY: an all-zero `nvmlFieldValue_t` is valid.
        let mut field: FieldValue = unsafe { std::mem::zeroed() };
        field.field_id = FI_DEV_NVLINK_LINK_COUNT;
        // SAFETY: a handle NVML gave and one field value.
        let status = unsafe { field_values(device, 1, &mut field) };
        (status == NVML_SUCCESS && field.nvml_return == NVML_SUCCESS).then_some((field.value as u32).min(MAX_LINKS))
    }

    /// Every link of the GPU at `address`, by index: as many as NVML's link count field says
    /// (so the front answers that field as NVML does), else up to the last link NVML knows.
    fn links(&self, address: PciAddress) -> Vec<Option<RawLink>> {
        let Some(device) = self.handle(address) else { return Vec::new() };
        let mut links: Vec<Option<RawLink>> = (0..MAX_LINKS).map(|link| self.link(device, link)).collect();
        match self.link_count(device) {
            Some(count) => links.truncate(count as usize),
            None => {
                while links.last().is_some_and(Option::is_none) {
                    links.pop();
                }
            }
        }
        links
    }
}

/// Each session GPU's links (the GPUs at `session`, in order), as the session may know them; no
/// links at all where NVML is missing or fails.
pub fn session_nvlinks(session: &[PciAddress]) -> Vec<Vec<NvLinkEnd>> {
    let nvml = match NVML.get_or_init(load) {
        Ok(nvml) => nvml,
        Err(reason) => {
            tracing::info!(%reason, "no NVML on this host: the session's GPUs show no NVLinks");
            return vec![Vec::new(); session.len()];
        }
    };
    session
        .iter()
        .map(|address| {
            let links = nvml.links(*address);
            links.iter().map(|link| link.as_ref().map_or(NvLinkEnd::Inactive, |link| classify(session, link))).collect()
        })
        .collect()
}

/// The emulated device's fixed topology: each pair of its `devices` GPUs joined by two links, a
/// device's links in the order of the peers they reach (device 0: links 0-1 to device 1, links 2-3
/// to device 2, ...), at most NVML's 18; a lone device has none.
pub fn emulated_nvlinks(devices: usize) -> Vec<Vec<NvLinkEnd>> {
    (0..devices)
        .map(|device| {
            let peers = (0..devices).filter(|peer| *peer != device);
            peers.flat_map(|peer| [NvLinkEnd::Device(peer as u32); 2]).take(MAX_LINKS as usize).collect()
        })
        .collect()
}

/// A session's NVLink table as one command-line word, for the listener to hand its workers what
/// its GPU probe asked NVML once (`crate::visible`), so no worker loads NVML as it starts (77-91
/// ms of each worker's start on an H200 host). GPUs are separated by `;`, each GPU's links by
/// `,`: `i` inactive, `s` a switch, `dN` device N of the session; `-` a GPU without links.
pub fn encode(table: &[Vec<NvLinkEnd>]) -> String {
    let end = |link: &NvLinkEnd| match link {
        NvLinkEnd::Inactive => "i".to_string(),
        NvLinkEnd::Switch => "s".to_string(),
        NvLinkEnd::Device(index) => format!("d{index}"),
    };
    let gpu = |links: &Vec<NvLinkEnd>| if links.is_empty() { "-".to_string() } else { links.iter().map(end).collect::<Vec<_>>().join(",") };
    table.iter().map(gpu).collect::<Vec<_>>().join(";")
}

/// Reads [`encode`]'s word for a session of `gpus` GPUs; anything else is an error naming it
/// (a link to the GPU itself, to a device past the session's, more links than NVML has).
pub fn decode(text: &str, gpus: usize) -> Result<Vec<Vec<NvLinkEnd>>, String> {
    let bad = |why: &str| format!("NVLink table {text:?}: {why}");
    let table: Vec<&str> = text.split(';').collect();
    if table.len() != gpus {
        return Err(bad(&format!("{} GPUs, the session has {gpus}", table.len())));
    }
    let gpu = |(own, links): (usize, &str)| -> Result<Vec<NvLinkEnd>, String> {
        if links == "-" {
            return Ok(Vec::new());
        }
        let ends: Vec<NvLinkEnd> = links
            .split(',')
            .map(|link| match link {
                "i" => Ok(NvLinkEnd::Inactive),
                "s" => Ok(NvLinkEnd::Switch),
                device => match device.strip_prefix('d').and_then(|index| index.parse::<u32>().ok()) {
                    Some(index) if (index as usize) < gpus && index as usize != own => Ok(NvLinkEnd::Device(index)),
                    _ => Err(bad(&format!("link {link:?} of GPU {own}"))),
                },
            })
            .collect::<Result<_, _>>()?;
        if ends.len() > MAX_LINKS as usize {
            return Err(bad(&format!("GPU {own} has {} links, NVML at most {MAX_LINKS}", ends.len())));
        }
        Ok(ends)
    };
    table.into_iter().enumerate().map(gpu).collect()
}

/// `c_int` attributes as a PCI address (a negative one reads 0).
pub fn pci_address(domain: c_int, bus: c_int, device: c_int) -> PciAddress {
    let unsigned = |value: c_int| u32::try_from(value).unwrap_or(0);
    (unsigned(domain), unsigned(bus), unsigned(device))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: PciAddress = (0, 0x18, 0);
    const B: PciAddress = (0, 0x2a, 0);
    const OTHER: PciAddress = (0, 0x3a, 0);
    const SWITCH: PciAddress = (0, 0x05, 0);

    fn up(remote: PciAddress) -> RawLink {
        RawLink { p2p_active: true, remote: Some(remote), ..RawLink::default() }
    }

    #[test]
    fn far_ends_are_named_as_the_session_may_know_them() {
        let session = [A, B];
        assert_eq!(classify(&session, &up(B)), NvLinkEnd::Device(1));
        assert_eq!(classify(&session, &up(A)), NvLinkEnd::Device(0));
        assert_eq!(classify(&session, &up(SWITCH)), NvLinkEnd::Switch, "a non-GPU far end");
        assert_eq!(classify(&session, &RawLink { remote_is_gpu: true, ..up(OTHER) }), NvLinkEnd::Inactive, "another tenant's GPU");
        assert_eq!(classify(&session, &RawLink { remote_is_host_gpu: true, ..up(OTHER) }), NvLinkEnd::Inactive, "a GPU of the host");
        assert_eq!(classify(&session, &RawLink { p2p_active: false, ..up(B) }), NvLinkEnd::Inactive, "down or not for P2P");
        assert_eq!(classify(&session, &RawLink { remote: None, ..up(B) }), NvLinkEnd::Inactive, "an unknown far end");
    }

    #[test]
    fn the_emulated_topology_joins_each_pair_by_two_links() {
        assert_eq!(emulated_nvlinks(1), vec![Vec::<NvLinkEnd>::new()]);
        let three = emulated_nvlinks(3);
        assert_eq!(three[0], [NvLinkEnd::Device(1), NvLinkEnd::Device(1), NvLinkEnd::Device(2), NvLinkEnd::Device(2)]);
        assert_eq!(three[2], [NvLinkEnd::Device(0), NvLinkEnd::Device(0), NvLinkEnd::Device(1), NvLinkEnd::Device(1)]);
    }

    #[test]
    fn a_table_crosses_the_command_line_whole() {
        let table = vec![
            vec![NvLinkEnd::Device(1), NvLinkEnd::Device(1), NvLinkEnd::Switch, NvLinkEnd::Inactive],
            Vec::new(),
            vec![NvLinkEnd::Device(0)],
        ];
        assert_eq!(encode(&table), "d1,d1,s,i;-;d0");
        assert_eq!(decode(&encode(&table), 3), Ok(table));
        assert_eq!(decode("-", 1), Ok(vec![Vec::new()]));
    }

    #[test]
    fn a_table_that_does_not_fit_the_session_is_refused() {
        for (text, gpus) in [("d1;-", 1), ("-", 2), ("d0", 1), ("d2;-", 2), ("x", 1), ("", 1), ("d1,,s;-", 2), ("d-1;-", 2)] {
            let refused = decode(text, gpus).expect_err(text);
            assert!(refused.contains("NVLink table"), "{refused}");
        }
        assert!(decode(&vec!["s"; 19].join(","), 1).is_err(), "more links than NVML has");
        assert!(decode(&vec!["s"; 18].join(","), 1).is_ok());
    }

    #[test]
    fn bus_ids_are_written_as_nvml_reads_them() {
        assert_eq!(bus_id_text((0, 0x1a, 3)), b"00000000:1a:03.0\0");
    }
}
