//! SM resources of the emulated device, partitioned as a Hopper GPU's (compute capability 9.0,
//! which the device reports): groups of at least 8 SMs in steps of 8, or of 2 in steps of 2 when
//! SM co-scheduling is ignored, the leftover SMs the remainder. Green contexts made from them hold
//! streams that behave as the device's other streams: it runs no kernels, so no SM is ever used.

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{DevResource, dev_resource};

/// The smallest group a split makes, and the step its size grows by.
const MIN_PARTITION: u32 = 8;
const STEP: u32 = 8;
/// The same, ignoring SM co-scheduling (`CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING`).
const MIN_PARTITION_IGNORING_COSCHEDULING: u32 = 2;

/// An SM resource of the emulated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EmulatedResource {
    sm_count: u32,
    /// The split that made it (0: the device's or a green context's whole resource), and which
    /// of its outputs it is (`u32::MAX`: the remainder).
    split: u64,
    index: u32,
}

impl EmulatedResource {
    /// The SMs of the device or of a green context.
    pub fn whole(sm_count: u32) -> Self {
        Self { sm_count, split: 0, index: 0 }
    }

    pub fn facts(&self) -> DevResource {
        // Two SMs a TPC, as the GPU's SMs pair up; an odd count has no pairs to promise.
        let coscheduled_alignment = if self.sm_count.is_multiple_of(2) { 2 } else { 1 };
        DevResource { id: 0, kind: dev_resource::SM, sm_count: self.sm_count, min_partition_size: MIN_PARTITION, coscheduled_alignment }
    }
}

/// What `cuDevSmResourceSplitByCount` makes of `input` (split `instance`): the groups (none
/// when only counting), how many, and the remainder. Refused as the driver documents: flags it
/// does not know, a minimum above the input's SMs, no group asked for; and a split's output
/// cannot be split again before a green context is made of it.
pub fn split(
    input: &EmulatedResource,
    groups: Option<u32>,
    flags: u32,
    min_count: u32,
    instance: u64,
) -> CudaResult<(Vec<EmulatedResource>, u32, EmulatedResource)> {
    use dev_resource::{SPLIT_IGNORE_SM_COSCHEDULING, SPLIT_MAX_POTENTIAL_CLUSTER_SIZE};
    if flags & !(SPLIT_IGNORE_SM_COSCHEDULING | SPLIT_MAX_POTENTIAL_CLUSTER_SIZE) != 0 || min_count > input.sm_count || groups == Some(0) {
        return Err(CudaError::INVALID_VALUE);
    }
    if input.split != 0 {
        return Err(CudaError::INVALID_RESOURCE_CONFIGURATION);
    }
    let (minimum, step) =
        if flags & SPLIT_IGNORE_SM_COSCHEDULING != 0 { (MIN_PARTITION_IGNORING_COSCHEDULING, 2) } else { (MIN_PARTITION, STEP) };
    let size = min_count.max(minimum).div_ceil(step) * step;
    let possible = input.sm_count / size;
    if possible == 0 {
        return Err(CudaError::INVALID_RESOURCE_CONFIGURATION);
    }
    let count = groups.map_or(possible, |asked| asked.min(possible));
    let made = match groups {
        Some(_) => (0..count).map(|index| EmulatedResource { sm_count: size, split: instance, index }).collect(),
        None => Vec::new(),
    };
    let remaining = EmulatedResource { sm_count: input.sm_count - count * size, split: instance, index: u32::MAX };
    Ok((made, count, remaining))
}

/// The SMs a descriptor of `resources` holds: one resource, or several outputs of one split,
/// each once, none empty.
pub fn described_sms(resources: &[EmulatedResource]) -> CudaResult<u32> {
    let first = resources.first().ok_or(CudaError::INVALID_VALUE)?;
    let one_split = resources.iter().all(|resource| resource.split == first.split && resource.split != 0);
    let distinct = resources.iter().enumerate().all(|(at, resource)| !resources[..at].contains(resource));
    if (resources.len() > 1 && !(one_split && distinct)) || resources.iter().any(|resource| resource.sm_count == 0) {
        return Err(CudaError::INVALID_RESOURCE_CONFIGURATION);
    }
    Ok(resources.iter().map(|resource| resource.sm_count).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_makes_aligned_groups_and_a_remainder() {
        let device = EmulatedResource::whole(132);
        assert_eq!(device.facts().coscheduled_alignment, 2);
        let (groups, count, rest) = split(&device, Some(3), 0, 20, 7).unwrap();
        assert_eq!((count, groups.len(), groups[0].sm_count, rest.sm_count), (3, 3, 24, 132 - 72));
        // Counting only: every group that fits.
        let (none, possible, _) = split(&device, None, 0, 20, 8).unwrap();
        assert_eq!((none.len(), possible), (0, 5));
        // More asked than fit: as many as fit.
        assert_eq!(split(&device, Some(100), 0, 0, 9).unwrap().1, 16);
        // Ignoring co-scheduling, groups of 2.
        assert_eq!(split(&device, None, dev_resource::SPLIT_IGNORE_SM_COSCHEDULING, 1, 10).unwrap().1, 66);
    }

    #[test]
    fn bad_splits_are_refused() {
        let device = EmulatedResource::whole(132);
        assert_eq!(split(&device, Some(1), 0, 133, 1).err(), Some(CudaError::INVALID_VALUE));
        assert_eq!(split(&device, Some(1), 4, 8, 1).err(), Some(CudaError::INVALID_VALUE));
        assert_eq!(split(&device, Some(0), 0, 8, 1).err(), Some(CudaError::INVALID_VALUE));
        assert_eq!(split(&device, Some(1), 0, 132, 1).err(), Some(CudaError::INVALID_RESOURCE_CONFIGURATION));
        let (groups, _, _) = split(&device, Some(2), 0, 8, 1).unwrap();
        assert_eq!(split(&groups[0], Some(1), 0, 8, 2).err(), Some(CudaError::INVALID_RESOURCE_CONFIGURATION));
    }

    #[test]
    fn descriptors_take_one_resource_or_outputs_of_one_split() {
        let device = EmulatedResource::whole(132);
        let (a, _, rest_a) = split(&device, Some(2), 0, 8, 1).unwrap();
        let (b, _, _) = split(&device, Some(2), 0, 8, 2).unwrap();
        assert_eq!(described_sms(&[device]), Ok(132));
        assert_eq!(described_sms(&[a[0], a[1], rest_a]), Ok(132));
        assert_eq!(described_sms(&[a[0], a[0]]).err(), Some(CudaError::INVALID_RESOURCE_CONFIGURATION));
        assert_eq!(described_sms(&[a[0], b[1]]).err(), Some(CudaError::INVALID_RESOURCE_CONFIGURATION));
        assert_eq!(described_sms(&[device, a[0]]).err(), Some(CudaError::INVALID_RESOURCE_CONFIGURATION));
        assert_eq!(described_sms(&[]).err(), Some(CudaError::INVALID_VALUE));
        let (_, _, nothing_left) = split(&EmulatedResource::whole(16), Some(2), 0, 8, 3).unwrap();
        assert_eq!(described_sms(&[nothing_left]).err(), Some(CudaError::INVALID_RESOURCE_CONFIGURATION));
    }
}
