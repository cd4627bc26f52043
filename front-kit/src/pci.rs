//! PCI bus ids as the driver and NVML print and take them.

/// Parses `[domain:]bus:device[.function]`, hexadecimal in any case, as `(domain, bus, device)`
/// (the function is not asked for). A `.` with nothing after it passes only where
/// `empty_function` says so (NVML lets it pass; the driver does not).
pub fn parse_bus_id(text: &str, empty_function: bool) -> Option<(u32, u32, u32)> {
    let text = text.trim();
    let without_function = match text.split_once('.') {
        Some((_, "")) if !empty_function => "",
        Some((head, _)) => head,
        None => text,
    };
    let parts: Vec<&str> = without_function.split(':').collect();
    let number = |part: &str| u32::from_str_radix(part, 16).ok();
    match parts.as_slice() {
        [domain, bus, device] => Some((number(domain)?, number(bus)?, number(device)?)),
        [bus, device] => Some((0, number(bus)?, number(device)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse_in_every_form_the_driver_and_nvml_print() {
        for empty_function in [false, true] {
            let parse = |text| parse_bus_id(text, empty_function);
            assert_eq!(parse("0000:3b:00.0"), Some((0, 0x3b, 0)));
            assert_eq!(parse("00000001:3B:02.0"), Some((1, 0x3b, 2)));
            assert_eq!(parse("00000000:1A:00.0"), Some((0, 0x1a, 0)));
            assert_eq!(parse("3b:00.0"), Some((0, 0x3b, 0)));
            assert_eq!(parse("0000:3b:00"), Some((0, 0x3b, 0)));
            assert_eq!(parse("1a:03"), Some((0, 0x1a, 3)));
            assert_eq!(parse("nonsense"), None);
            assert_eq!(parse("0:1:2:3"), None);
        }
        assert_eq!(parse_bus_id("0000:3b:00.", false), None, "the driver refuses an empty function");
        assert_eq!(parse_bus_id("0000:3b:00.", true), Some((0, 0x3b, 0)), "NVML ignores it");
    }
}
