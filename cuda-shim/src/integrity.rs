//! The integrity check NVIDIA's runtime runs against the driver (export table `d4082055-...`, entry 1):
//! HMAC-MD2 over what the process observes through the driver API. The runtime computes the same value
//! from what it sees and refuses to work on a mismatch, so it is computed here, from exactly what this
//! library reports: the driver version, the process and thread ids, the addresses of this library's own
//! CudartInterface and integrity tables and of the check function, the caller's timestamp, and each
//! device's UUID and PCI domain/bus/device attributes.

/// MD2's substitution table (RFC 1319: digits of pi).
const S: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199, 115, 140, 152, 147, 43, 217, 188, 76,
    130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66, 111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245,
    142, 187, 47, 238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93, 154, 90, 144, 50, 39, 53,
    62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209, 215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164,
    125, 182, 118, 252, 107, 226, 156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27, 96, 37,
    173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81, 175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44,
    83, 13, 110, 133, 40, 132, 9, 211, 223, 205, 244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189,
    177, 74, 120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14, 102, 88, 208, 228, 166, 119, 114,
    248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26, 219, 153, 141, 51, 159, 17, 131, 20,
];

/// MD2, byte at a time. The state is laid out as the driver's is (`x` 48, checksum 16, count, last
/// checksum byte): the tests compare it with states captured from the real driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Md2 {
    x: [u8; 48],
    checksum: [u8; 16],
    count: u8,
    last: u8,
}

impl Default for Md2 {
    fn default() -> Md2 {
        Md2 { x: [0; 48], checksum: [0; 16], count: 0, last: 0 }
    }
}

impl Md2 {
    pub fn update(&mut self, data: &[u8]) {
        for &byte in data {
            self.byte(byte);
        }
    }

    fn byte(&mut self, byte: u8) {
        let n = usize::from(self.count);
        self.x[16 + n] = byte;
        self.x[32 + n] = byte ^ self.x[n];
        self.checksum[n] ^= S[usize::from(byte ^ self.last)];
        self.last = self.checksum[n];
        self.count = ((n + 1) & 15) as u8;
        if self.count == 0 {
            self.compress();
        }
    }

    fn compress(&mut self) {
        let mut t = 0u8;
        for round in 0..18u8 {
            for x in &mut self.x {
                *x ^= S[usize::from(t)];
                t = *x;
            }
            t = t.wrapping_add(round);
        }
    }

    pub fn finish(mut self) -> [u8; 16] {
        let pad = 16 - self.count;
        for _ in 0..pad {
            self.byte(pad);
        }
        let checksum = self.checksum;
        self.update(&checksum);
        let mut digest = [0; 16];
        digest.copy_from_slice(&self.x[..16]);
        digest
    }
}

/// The HMAC key (one MD2 block).
const KEY: [u8; 16] = [0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f];

/// What is hashed before the devices (48 bytes, little-endian).
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub driver_version: u32,
    pub version: u32,
    pub process: u32,
    pub thread: u32,
    pub cudart_table: u64,
    pub integrity_table: u64,
    pub check_function: u64,
    pub unix_seconds: u64,
}

impl Header {
    fn bytes(&self) -> [u8; 48] {
        let mut out = [0; 48];
        out[0..4].copy_from_slice(&self.driver_version.to_le_bytes());
        out[4..8].copy_from_slice(&self.version.to_le_bytes());
        out[8..12].copy_from_slice(&self.process.to_le_bytes());
        out[12..16].copy_from_slice(&self.thread.to_le_bytes());
        out[16..24].copy_from_slice(&self.cudart_table.to_le_bytes());
        out[24..32].copy_from_slice(&self.integrity_table.to_le_bytes());
        out[32..40].copy_from_slice(&self.check_function.to_le_bytes());
        out[40..48].copy_from_slice(&self.unix_seconds.to_le_bytes());
        out
    }
}

/// One device as hashed: its UUID and PCI domain, bus and device (28 bytes, little-endian).
#[derive(Clone, Copy, Debug)]
pub struct DeviceIdentity {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

impl DeviceIdentity {
    fn bytes(&self) -> [u8; 28] {
        let mut out = [0; 28];
        out[..16].copy_from_slice(&self.uuid);
        out[16..20].copy_from_slice(&self.pci_domain.to_le_bytes());
        out[20..24].copy_from_slice(&self.pci_bus.to_le_bytes());
        out[24..28].copy_from_slice(&self.pci_device.to_le_bytes());
        out
    }
}

fn keyed(pad: u8) -> Md2 {
    let mut md2 = Md2::default();
    md2.update(&KEY.map(|k| k ^ pad));
    md2
}

/// The check's answer for `header.version` (the caller's scheme: versions ending in 0 and 1 get fixed
/// answers, as from the real driver).
pub fn check_value(header: &Header, devices: &[DeviceIdentity]) -> [u64; 2] {
    match header.version % 10 {
        0 => return [0x3341181c03cb675c, 0x8ed383aa1f4cd1e8],
        1 => return [0x1841181c03cb675c, 0x8ed383aa1f4cd1e8],
        _ => {}
    }
    let mut inner = keyed(0x36);
    inner.update(&header.bytes());
    for device in devices {
        inner.update(&device.bytes());
    }
    let mut outer = keyed(0x5c);
    outer.update(&inner.finish());
    let digest = outer.finish();
    let word = |i: usize| u64::from_le_bytes(digest[i..i + 8].try_into().unwrap_or_default());
    [word(0), word(8)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md2_hex(data: &[u8]) -> String {
        let mut md2 = Md2::default();
        md2.update(data);
        md2.finish().iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn md2_matches_rfc_1319() {
        assert_eq!(md2_hex(b""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(md2_hex(b"a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
        assert_eq!(md2_hex(b"abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(md2_hex(b"message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
        assert_eq!(md2_hex(b"abcdefghijklmnopqrstuvwxyz"), "4e8ddff3650292ab5a4108c3aa47940b");
        assert_eq!(md2_hex(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"), "da33def2a42df13975352846c30338cd");
        assert_eq!(md2_hex("1234567890".repeat(8).as_bytes()), "d5976f79d83d3a0dc9806c3c66f3efd8");
    }

    // States captured from NVIDIA's driver 12.8-era check (published with ZLUDA's dark_api tests): 66 bytes
    // laid out as `Md2` is.
    fn from_state(state: [u8; 66]) -> Md2 {
        let mut md2 = Md2::default();
        md2.x.copy_from_slice(&state[..48]);
        md2.checksum.copy_from_slice(&state[48..64]);
        md2.count = state[64];
        md2.last = state[65];
        md2
    }

    fn state(md2: &Md2) -> Vec<u8> {
        [&md2.x[..], &md2.checksum[..], &[md2.count, md2.last]].concat()
    }

    const AFTER_KEY: [u8; 66] = [
        0x8b, 0x21, 0x9a, 0x49, 0xe8, 0x6d, 0x1a, 0xee, 0xf2, 0x37, 0xf9, 0xb5, 0x4a, 0x8c, 0x3c, 0x75, 0xc7, 0x1e, 0xee, 0x21, 0xcf, 0x29,
        0x8a, 0xe5, 0x13, 0x83, 0xf4, 0xec, 0x33, 0x04, 0xe2, 0xfd, 0xb0, 0x2f, 0x09, 0x01, 0x4f, 0xf7, 0x68, 0x6d, 0x69, 0x46, 0x43, 0x7e,
        0xb6, 0x2b, 0x21, 0xed, 0x57, 0xa1, 0x10, 0x86, 0x0e, 0x60, 0x44, 0x1e, 0x70, 0x5f, 0x67, 0xd1, 0xeb, 0x67, 0xa1, 0x3d, 0x00, 0x3d,
    ];

    #[test]
    fn inner_key_block_matches_the_driver() {
        assert_eq!(state(&keyed(0x36)), AFTER_KEY.to_vec());
    }

    #[test]
    fn header_matches_the_driver() {
        let mut md2 = from_state(AFTER_KEY);
        let header = Header {
            driver_version: 0x2f30,
            version: 12082,
            process: 0x002fa423,
            thread: 0xf79c1000,
            cudart_table: 0x00007ffff6958240,
            integrity_table: 0x00007ffff6958220,
            check_function: 0x00007ffff2aaf4a0,
            unix_seconds: 0x682b9cee,
        };
        md2.update(&header.bytes());
        let expected = [
            0x0a, 0xfd, 0xab, 0xc9, 0xff, 0x9b, 0xa0, 0xbe, 0x4d, 0x30, 0x32, 0x82, 0x74, 0x4f, 0xa7, 0x48, 0x9d, 0x23, 0x82, 0xa3, 0x87,
            0xfa, 0x6c, 0xdb, 0x92, 0x49, 0xd9, 0xb5, 0x4b, 0x2b, 0x5e, 0x51, 0x6e, 0xf7, 0xf9, 0x4d, 0x28, 0x8a, 0x64, 0x06, 0x19, 0xb3,
            0xe6, 0xbe, 0xa4, 0xec, 0x7e, 0x54, 0x64, 0x28, 0xd9, 0xe1, 0xd4, 0x34, 0xc0, 0xa9, 0x49, 0x88, 0xc9, 0x61, 0x58, 0xdd, 0x66,
            0x74, 0x00, 0x74u8,
        ];
        assert_eq!(state(&md2), expected.to_vec());
    }

    #[test]
    fn device_matches_the_driver() {
        let mut md2 = from_state([
            0x84, 0xfd, 0x93, 0x10, 0xc6, 0xdb, 0xb3, 0xbc, 0x49, 0xc2, 0x25, 0xe7, 0xda, 0x6e, 0x22, 0x6f, 0x9b, 0xbd, 0x81, 0x59, 0xc3,
            0x01, 0x9a, 0x7a, 0x26, 0x34, 0x39, 0x0f, 0x2a, 0x56, 0x13, 0xb1, 0xf6, 0xbc, 0x7f, 0xa1, 0x8f, 0x04, 0xa5, 0x4d, 0x0d, 0x78,
            0xab, 0x20, 0xf8, 0x23, 0x20, 0xa5, 0x3f, 0x67, 0x36, 0xe2, 0xde, 0x8a, 0xe5, 0xdf, 0xe1, 0xf2, 0x03, 0x94, 0xad, 0xdc, 0x9a,
            0xda, 0x00, 0xda,
        ]);
        let mut uuid = [0u8; 16];
        for (i, word) in [0x8a2bfe9au32, 0x382d25ac, 0xc5ae37ea, 0x5f32716d].iter().enumerate() {
            uuid[i * 4..i * 4 + 4].copy_from_slice(&word.to_le_bytes());
        }
        md2.update(&DeviceIdentity { uuid, pci_domain: 0, pci_bus: 2, pci_device: 0 }.bytes());
        let expected = [
            0x1f, 0xd8, 0x25, 0xd2, 0xdf, 0xfa, 0x64, 0xc7, 0xb6, 0x1a, 0xaf, 0x22, 0xb8, 0x79, 0xfb, 0x96, 0x00, 0x00, 0x00, 0x00, 0x02,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7c, 0x9d, 0x46, 0xd2, 0x1f, 0xd8, 0x25, 0xd2, 0xdd, 0xfa, 0x64, 0xc7, 0xb6, 0x1a,
            0xaf, 0x22, 0xe6, 0x17, 0xbd, 0x3a, 0xd7, 0xdd, 0x5f, 0x82, 0x8c, 0x87, 0xce, 0x86, 0x66, 0xaf, 0xa0, 0x50, 0x7a, 0x7d, 0xbb,
            0xbc, 0x0c, 0x50u8,
        ];
        assert_eq!(state(&md2), expected.to_vec());
    }

    #[test]
    fn finish_matches_the_driver() {
        let md2 = from_state([
            0x3e, 0x4b, 0xf2, 0x95, 0x71, 0xf5, 0x6b, 0x51, 0x07, 0xbf, 0x4b, 0xf1, 0x04, 0x0e, 0x8e, 0x0b, 0x5f, 0x4d, 0x30, 0x0c, 0x0f,
            0x0c, 0xae, 0xfb, 0x48, 0xaf, 0x23, 0xb5, 0xea, 0x4c, 0xc2, 0xdb, 0xd7, 0xdf, 0x88, 0x74, 0x39, 0x58, 0x16, 0x3a, 0x1f, 0x7c,
            0x9b, 0x20, 0x7e, 0x7e, 0x94, 0xc8, 0x8b, 0xc6, 0xb2, 0x38, 0x0d, 0x07, 0x7d, 0xbd, 0x90, 0xd5, 0x39, 0x63, 0xeb, 0x1d, 0x4f,
            0x40, 0x00, 0x40,
        ]);
        let expected = [0x00, 0x23, 0x53, 0x06, 0x5e, 0x96, 0xf6, 0x9c, 0x61, 0xaa, 0x96, 0x2d, 0x2e, 0xcd, 0xa8, 0x58u8];
        assert_eq!(md2.finish(), expected);
    }

    #[test]
    fn short_circuits_and_full_check() {
        let mut header = Header {
            driver_version: 13000,
            version: 13000,
            process: 1,
            thread: 2,
            cudart_table: 3,
            integrity_table: 4,
            check_function: 5,
            unix_seconds: 6,
        };
        assert_eq!(check_value(&header, &[]), [0x3341181c03cb675c, 0x8ed383aa1f4cd1e8]);
        header.version = 12081;
        assert_eq!(check_value(&header, &[]), [0x1841181c03cb675c, 0x8ed383aa1f4cd1e8]);
        header.version = 13002;
        let device = DeviceIdentity { uuid: [7; 16], pci_domain: 0, pci_bus: 0x3b, pci_device: 0 };
        // The full check is HMAC-MD2(key, header || devices), spelled out here with the MD2 the tests above
        // tie to the driver.
        let mut inner = keyed(0x36);
        inner.update(&header.bytes());
        inner.update(&device.bytes());
        let mut outer = keyed(0x5c);
        outer.update(&inner.finish());
        let digest = outer.finish();
        let expected = [u64::from_le_bytes(digest[..8].try_into().unwrap()), u64::from_le_bytes(digest[8..].try_into().unwrap())];
        assert_eq!(check_value(&header, &[device]), expected);
        assert_ne!(check_value(&header, &[]), expected, "devices are part of the hash");
        header.thread = 3;
        assert_ne!(check_value(&header, &[device]), expected, "so is the thread");
    }
}
