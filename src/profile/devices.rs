//! Profiles of several devices: a YAML file that names one machine profile
//! per device, by ggml's device name, in the order the devices are listed.
//!
//! ```yaml
//! devices:
//!   - name: CUDA0
//!     profile: h200.yaml        # relative to this file
//!   - name: CUDA1
//!     profile: rtx3090.yaml
//! ```
//!
//! Each profile is a one-device profile as `pipeshard profile` writes it on
//! the machine (or with only that card visible, `CUDA_VISIBLE_DEVICES`):
//! its GPU figures and link are that device's, its CPU figures the host's.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{MachineProfile, ProfileError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DevicesFile {
    devices: Vec<DeviceEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceEntry {
    name: String,
    profile: PathBuf,
}

/// The profiles of a devices file at `path`, by device name in its order;
/// None where `path` is a one-device profile (it has no `devices` key).
pub fn load_devices(path: &Path) -> Result<Option<Vec<(String, MachineProfile)>>, ProfileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let parse = |source| ProfileError::Parse {
        path: path.to_path_buf(),
        source,
    };
    let value: serde_yaml::Value = serde_yaml::from_str(&text).map_err(parse)?;
    if value.get("devices").is_none() {
        return Ok(None);
    }
    let file: DevicesFile = serde_yaml::from_value(value).map_err(parse)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    file.devices
        .into_iter()
        .map(|d| Ok((d.name, MachineProfile::load(&dir.join(d.profile))?)))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}
