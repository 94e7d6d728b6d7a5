//! Budgets per device: `--vram-budget CUDA0=10GiB,CUDA1=6GiB` and
//! `--vram-headroom CUDA0=1GiB,CUDA1=512MiB`.
//!
//! A list of `DEVICE=SIZE` pairs is one budget set, one budget per device
//! as ggml names them (`CUDA0`, `RPC0`, ...); a device that is not listed is
//! not used. A list of plain sizes stays what it was: `bench`'s sweep of
//! one-device budgets. The two forms do not mix.

use crate::engine::{self, DeviceKind};
use crate::plan;

use super::options::{default_headroom, BudgetSpec};
use super::LaunchError;

/// One device's budget as given: its ggml name and a size or `auto`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceBudgetSpec {
    pub device: String,
    pub budget: BudgetSpec,
}

/// What `--vram-budget` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetList {
    /// Plain sizes: one budget, or `bench`'s sweep.
    Sizes(Vec<BudgetSpec>),
    /// One budget per device, in the order given.
    PerDevice(Vec<DeviceBudgetSpec>),
}

impl BudgetList {
    /// Parse `--vram-budget`: comma-separated sizes, or `DEVICE=SIZE` pairs.
    pub fn parse(s: &str) -> Result<BudgetList, LaunchError> {
        let items: Vec<&str> = s.split(',').map(str::trim).collect();
        let pairs = items.iter().filter(|i| i.contains('=')).count();
        if pairs == 0 {
            return items
                .iter()
                .map(|i| BudgetSpec::parse(i))
                .collect::<Result<_, _>>()
                .map(BudgetList::Sizes);
        }
        if pairs != items.len() {
            return Err(LaunchError::Options(format!(
                "--vram-budget {s:?} mixes sizes and DEVICE=SIZE pairs: give either sizes (bench's sweep) or one DEVICE=SIZE per device"
            )));
        }
        let mut specs: Vec<DeviceBudgetSpec> = Vec::new();
        for item in items {
            let (device, size) = split_pair(item)?;
            if specs.iter().any(|d| d.device.eq_ignore_ascii_case(device)) {
                return Err(LaunchError::Options(format!("--vram-budget names {device} twice")));
            }
            specs.push(DeviceBudgetSpec {
                device: device.to_string(),
                budget: BudgetSpec::parse(size)?,
            });
        }
        Ok(BudgetList::PerDevice(specs))
    }
}

/// `DEVICE=VALUE` split at the `=`; the device must be named.
fn split_pair(item: &str) -> Result<(&str, &str), LaunchError> {
    match item.split_once('=') {
        Some((device, value)) if !device.trim().is_empty() => Ok((device.trim(), value.trim())),
        Some(_) => Err(LaunchError::Options(format!("{item:?}: no device before '='"))),
        None => Err(LaunchError::Options(format!("{item:?} is not DEVICE=SIZE"))),
    }
}

/// `--vram-headroom`: one size for every device, or one per device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Headroom {
    All(u64),
    PerDevice(Vec<(String, u64)>),
}

impl Headroom {
    /// Parse `--vram-headroom`: a size, or `DEVICE=SIZE` pairs.
    pub fn parse(s: &str) -> Result<Headroom, String> {
        if !s.contains('=') {
            return plan::parse_bytes(s).map(Headroom::All).map_err(|e| e.to_string());
        }
        let mut v = Vec::new();
        for item in s.split(',').map(str::trim) {
            let (device, size) = split_pair(item).map_err(|e| e.to_string())?;
            let bytes = plan::parse_bytes(size).map_err(|e| format!("{device}: {e}"))?;
            v.push((device.to_string(), bytes));
        }
        Ok(Headroom::PerDevice(v))
    }

    /// The headroom of the device named `device`; None: the default.
    pub fn of(&self, device: &str) -> Option<u64> {
        match self {
            Headroom::All(b) => Some(*b),
            Headroom::PerDevice(v) => v.iter().find(|(d, _)| d.eq_ignore_ascii_case(device)).map(|&(_, b)| b),
        }
    }
}

/// A device's budget, resolved against the devices ggml loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceBudget {
    /// ggml's name of the device (`CUDA0`, `RPC0`).
    pub device: String,
    /// ggml's index of the device.
    pub index: usize,
    pub description: String,
    /// Device memory the process may use there, bytes.
    pub bytes: u64,
}

/// Resolve `specs` against `devices` (what ggml loaded): every device named
/// must exist and take a budget; `auto` reads that card through NVML (its
/// memory less every other process's use and its headroom), else ggml's
/// free figure less the headroom.
pub fn resolve(
    specs: &[DeviceBudgetSpec],
    headroom: Option<&Headroom>,
    devices: &[engine::Device],
) -> Result<Vec<DeviceBudget>, LaunchError> {
    specs
        .iter()
        .map(|spec| {
            let dev = find(devices, &spec.device)?;
            let headroom = headroom.and_then(|h| h.of(&dev.name));
            let bytes = match spec.budget {
                BudgetSpec::Bytes(b) => b,
                BudgetSpec::Auto => auto_bytes(dev, headroom),
            };
            Ok(DeviceBudget {
                device: dev.name.clone(),
                index: dev.index,
                description: dev.description.clone(),
                bytes,
            })
        })
        .collect()
}

/// The device named `name` (ignoring case), which must hold weights.
fn find<'d>(devices: &'d [engine::Device], name: &str) -> Result<&'d engine::Device, LaunchError> {
    let budgeted = |d: &&engine::Device| d.kind != DeviceKind::Cpu;
    match devices.iter().find(|d| d.name.eq_ignore_ascii_case(name)) {
        Some(d) if budgeted(&d) => Ok(d),
        Some(d) => Err(LaunchError::Options(format!(
            "--vram-budget {}: the CPU takes no VRAM budget (host weights are what no device budget holds)",
            d.name
        ))),
        None => {
            let known: Vec<&str> = devices.iter().filter(budgeted).map(|d| d.name.as_str()).collect();
            Err(LaunchError::NoSuchDevice {
                name: name.to_string(),
                known: if known.is_empty() {
                    "none (no GPU backend is loaded)".into()
                } else {
                    known.join(", ")
                },
            })
        }
    }
}

/// `auto` on one device.
fn auto_bytes(dev: &engine::Device, headroom: Option<u64>) -> u64 {
    if let Some(u) = dev.device_id.as_deref().and_then(engine::nvml::device_usage) {
        let headroom = headroom.unwrap_or_else(|| default_headroom(u.total));
        return u.total.saturating_sub(u.others).saturating_sub(headroom);
    }
    let headroom = headroom.unwrap_or_else(|| default_headroom(dev.total_bytes));
    dev.free_bytes.saturating_sub(headroom)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(index: usize, name: &str, kind: DeviceKind, free: u64, total: u64) -> engine::Device {
        engine::Device {
            index,
            name: name.into(),
            description: format!("{name} card"),
            kind,
            free_bytes: free,
            total_bytes: total,
            device_id: None,
        }
    }

    fn machine() -> Vec<engine::Device> {
        vec![
            device(0, "CUDA0", DeviceKind::Gpu, 20 << 30, 24 << 30),
            device(1, "CUDA1", DeviceKind::Gpu, 10 << 30, 12 << 30),
            device(2, "CPU", DeviceKind::Cpu, 0, 0),
        ]
    }

    fn per_device(s: &str) -> Vec<DeviceBudgetSpec> {
        match BudgetList::parse(s).unwrap() {
            BudgetList::PerDevice(v) => v,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sizes_stay_benchs_sweep_and_pairs_are_one_set() {
        assert_eq!(
            BudgetList::parse("4GiB, 6GiB").unwrap(),
            BudgetList::Sizes(vec![BudgetSpec::Bytes(4 << 30), BudgetSpec::Bytes(6 << 30)])
        );
        assert_eq!(
            per_device("CUDA0=10GiB, CUDA1=auto"),
            vec![
                DeviceBudgetSpec {
                    device: "CUDA0".into(),
                    budget: BudgetSpec::Bytes(10 << 30)
                },
                DeviceBudgetSpec {
                    device: "CUDA1".into(),
                    budget: BudgetSpec::Auto
                },
            ]
        );
    }

    #[test]
    fn malformed_lists_are_errors() {
        for bad in [
            "CUDA0=4GiB,6GiB",
            "=4GiB",
            "CUDA0=lots",
            "CUDA0=4GiB,cuda0=2GiB",
            "CUDA0=",
        ] {
            assert!(BudgetList::parse(bad).is_err(), "{bad}");
        }
        for bad in ["CUDA0=", "=1GiB", "CUDA0=1GiB,CUDA1"] {
            assert!(Headroom::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn listed_devices_resolve_in_order_and_auto_leaves_each_its_headroom() {
        let headroom = Headroom::parse("CUDA1=1GiB").unwrap();
        let r = resolve(&per_device("cuda1=auto,CUDA0=auto"), Some(&headroom), &machine()).unwrap();
        assert_eq!(
            r.iter().map(|d| d.device.as_str()).collect::<Vec<_>>(),
            ["CUDA1", "CUDA0"]
        );
        assert_eq!(r[0].bytes, 9 << 30);
        // CUDA0 has no headroom of its own: the default, 5% of 24 GiB.
        assert_eq!(r[1].bytes, (20u64 << 30) - default_headroom(24 << 30));
        let all = Headroom::parse("2GiB").unwrap();
        assert_eq!(
            resolve(&per_device("CUDA0=auto"), Some(&all), &machine()).unwrap()[0].bytes,
            18 << 30
        );
    }

    #[test]
    fn a_missing_device_or_the_cpu_is_an_error_naming_the_devices() {
        let e = resolve(&per_device("CUDA2=4GiB"), None, &machine())
            .unwrap_err()
            .to_string();
        assert!(e.contains("CUDA2") && e.contains("CUDA0, CUDA1"), "{e}");
        let e = resolve(&per_device("CPU=4GiB"), None, &machine())
            .unwrap_err()
            .to_string();
        assert!(e.contains("CPU takes no VRAM budget"), "{e}");
    }
}
