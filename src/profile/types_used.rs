//! The samples a model's weight types need beyond a profile's own: the
//! expert matmuls (MUL_MAT_ID) of its routed experts' types, and the CPU's
//! matmuls beside the link's copies of its other weights' types. A profile
//! measures both for Q4_0 only; the others are measured on a model's first
//! use on the machine ([`super::measure_missing`]) and kept in the profile.

use super::{Device, MachineProfile};
use crate::gguf::{GgmlType, ModelInfo};

/// The weight types of a model's matmuls, by kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TypesUsed {
    /// The routed experts' types.
    pub experts: Vec<GgmlType>,
    /// The other weights' types (two dimensions or more, quantized).
    pub dense: Vec<GgmlType>,
}

impl TypesUsed {
    /// The types `info`'s weights use, each once, in type order.
    pub fn of(info: &ModelInfo) -> TypesUsed {
        let mut used = TypesUsed::default();
        for t in info.tensors.iter().filter(|t| t.dims.len() >= 2 && t.ty.is_quantized()) {
            let kind = if t.holds_routed_experts() {
                &mut used.experts
            } else {
                &mut used.dense
            };
            if !kind.contains(&t.ty) {
                kind.push(t.ty);
            }
        }
        used.experts.sort_by_key(|t| t.id());
        used.dense.sort_by_key(|t| t.id());
        used
    }
}

/// The samples a profile lacks for a model's types.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Missing {
    /// Expert matmuls of a type on a device.
    pub experts: Vec<(Device, GgmlType)>,
    /// CPU matmuls of a type beside the link's copies (GPU profiles only).
    pub beside_copies: Vec<GgmlType>,
}

impl Missing {
    /// What `profile` lacks for `used`: expert samples on each device it
    /// measured, and for a profile with a GPU, the CPU's beside the copies.
    pub fn of(profile: &MachineProfile, used: &TypesUsed) -> Missing {
        let has = |device: Device, ty: GgmlType, experts: bool, busy: bool| {
            profile.matmul.iter().any(|s| {
                s.device == device && s.ty == ty.name() && s.experts.is_some() == experts && s.link_busy == busy
            })
        };
        let gpu = profile.has_gpu();
        let devices: &[Device] = if gpu {
            &[Device::Cpu, Device::Gpu]
        } else {
            &[Device::Cpu]
        };
        Missing {
            experts: used
                .experts
                .iter()
                .flat_map(|&ty| devices.iter().map(move |&d| (d, ty)))
                .filter(|&(d, ty)| !has(d, ty, true, false))
                .collect(),
            beside_copies: used
                .dense
                .iter()
                .copied()
                .filter(|&ty| gpu && !has(Device::Cpu, ty, false, true))
                .collect(),
        }
    }

    /// Nothing to measure.
    pub fn is_empty(&self) -> bool {
        self.experts.is_empty() && self.beside_copies.is_empty()
    }
}
