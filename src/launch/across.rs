//! A plan across devices, for a command that runs it: budgets per device
//! resolved, each device's profile, the layer split planned, installed into
//! the model's and context's parameters, and what was loaded checked against
//! it device by device.

use std::path::Path;

use crate::engine::{self, Context, ContextParams, ModelParams};
use crate::gguf::ModelInfo;
use crate::plan::apply_devices::{apply_devices, AppliedDevices};
use crate::plan::devices::{make_devices_plan, DeviceShare, DevicesPlan};
use crate::plan::fmt_bytes;
use crate::profile::{self, MachineProfile, TypesUsed};

use super::devices::DeviceBudget;
use super::{machine_profile, plan_request, LaunchError, LaunchRequest, PipeshardOptions};

/// The per-device budgets of `options` when they ask for a plan across
/// devices: several devices, or one that is not the first GPU (which the
/// one-device plans run on). None: no budgets per device, or one for the
/// first GPU.
pub fn budgets_across(options: &PipeshardOptions) -> Result<Option<Vec<DeviceBudget>>, LaunchError> {
    let Some(budgets) = options.device_budgets()? else {
        return Ok(None);
    };
    let first = engine::first_device(engine::DeviceKind::Gpu).map(|d| d.index);
    Ok(match budgets.as_slice() {
        [one] if Some(one.index) == first => None,
        _ => Some(budgets),
    })
}

/// Each device's profile: from a devices file (`--profile` naming one per
/// device), else the one profile `fallback` gives, for every device.
pub fn device_profiles<E>(
    path: Option<&Path>,
    devices: &[String],
    fallback: impl FnOnce() -> Result<MachineProfile, E>,
) -> Result<Vec<MachineProfile>, E>
where
    E: From<LaunchError>,
{
    let listed = match path {
        Some(p) => profile::load_devices(p).map_err(|e| E::from(LaunchError::Profile(e)))?,
        None => None,
    };
    let Some(listed) = listed else {
        let one = fallback()?;
        return Ok(vec![one; devices.len()]);
    };
    devices
        .iter()
        .map(|device| {
            listed
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(device))
                .map(|(_, p)| p.clone())
                .ok_or_else(|| {
                    let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
                    E::from(LaunchError::Options(format!(
                        "the devices profile has no device {device} (it names {})",
                        names.join(", ")
                    )))
                })
        })
        .collect()
}

/// A plan across devices ready to install, with the devices it runs on.
#[derive(Debug, Clone)]
pub struct AcrossLaunch {
    pub plan: DevicesPlan,
    /// In the plan's order.
    pub budgets: Vec<DeviceBudget>,
}

/// Plan `req`'s model across the devices of `budgets`, for a context made
/// with `cp`; `progress` follows a profile's measurement where this machine
/// has none yet.
pub fn plan_across(
    req: &LaunchRequest<'_>,
    cp: &ContextParams,
    budgets: Vec<DeviceBudget>,
    progress: impl FnMut(u64, u64),
) -> Result<AcrossLaunch, LaunchError> {
    let (_, info) = crate::gguf::inspect(req.model).map_err(|source| LaunchError::Model {
        path: req.model.to_path_buf(),
        source: Box::new(source),
    })?;
    let names: Vec<String> = budgets.iter().map(|b| b.device.clone()).collect();
    let profiles = device_profiles(req.options.profile.as_deref(), &names, || {
        machine_profile(None, req.threads, &TypesUsed::of(&info), progress)
    })?;
    let plan = plan_on(&info, req, cp, &budgets, &profiles)?;
    Ok(AcrossLaunch { plan, budgets })
}

/// The plan of `info` across `budgets`' devices with their `profiles`.
fn plan_on(
    info: &ModelInfo,
    req: &LaunchRequest<'_>,
    cp: &ContextParams,
    budgets: &[DeviceBudget],
    profiles: &[MachineProfile],
) -> Result<DevicesPlan, LaunchError> {
    let (pr, _) = plan_request(req, info, cp, 0, &profiles[0]);
    let shares: Vec<DeviceShare<'_>> = budgets
        .iter()
        .zip(profiles)
        .map(|(b, profile)| DeviceShare {
            device: b.device.clone(),
            budget: b.bytes,
            profile,
        })
        .collect();
    Ok(make_devices_plan(info, &shares, &pr)?)
}

/// One device's part as loaded.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceLoaded {
    pub device: String,
    pub first_layer: u32,
    pub end_layer: u32,
    /// Weights the plan keeps on the device, all of which loaded there.
    pub resident_weights: usize,
    /// Their device bytes as planned.
    pub planned_resident_bytes: u64,
    /// Weight bytes llama.cpp holds on the device.
    pub model_bytes: u64,
    /// Everything llama.cpp holds on the device: weights, KV, compute.
    pub llama_bytes: u64,
    pub budget: u64,
}

impl AcrossLaunch {
    /// Put the plan into the parameters the model and context are made with.
    pub fn install(&self, mp: &mut ModelParams<'_>, cp: &mut ContextParams) -> Result<AppliedDevices, LaunchError> {
        let indices: Vec<usize> = self.budgets.iter().map(|b| b.index).collect();
        let applied = apply_devices(&self.plan, &indices)?;
        applied.configure_model(mp);
        applied.applied.configure_context(cp);
        Ok(applied)
    }

    /// Check the loaded model against the plan: every weight where the plan
    /// put it (its device's buffers, or host memory), and each device's
    /// llama.cpp buffers within its budget.
    pub fn verify_loaded(
        &self,
        applied: &AppliedDevices,
        ctx: &mut Context<'_>,
    ) -> Result<Vec<DeviceLoaded>, LaunchError> {
        let memory = ctx.memory_breakdown();
        let cref = ctx.context_ref();
        let mut loaded = Vec::with_capacity(self.plan.parts.len());
        for ((part, budget), buft) in self.plan.parts.iter().zip(&self.budgets).zip(&applied.device_bufts) {
            let mut resident = 0;
            for t in &part.plan.tensors {
                let Some(got) = cref.weight_buffer_type(&t.name) else {
                    continue;
                };
                let placed = if t.resident { got == *buft } else { got.is_host() };
                if !placed {
                    return Err(LaunchError::Placement(format!(
                        "{} loaded into {}, where the plan puts it {}",
                        t.name,
                        got.name(),
                        if t.resident {
                            buft.name()
                        } else {
                            "in host memory".into()
                        }
                    )));
                }
                resident += usize::from(t.resident);
            }
            let on_device = memory.iter().filter(|m| m.device == Some(budget.index) && !m.is_host);
            let (model_bytes, llama_bytes) = on_device.fold((0, 0), |(w, a), m| (w + m.model, a + m.total()));
            if llama_bytes > budget.bytes {
                return Err(LaunchError::OverBudget {
                    what: format!("{}'s llama.cpp buffers", part.device),
                    used: llama_bytes,
                    budget: budget.bytes,
                });
            }
            loaded.push(DeviceLoaded {
                device: part.device.clone(),
                first_layer: part.first_layer,
                end_layer: part.end_layer(),
                resident_weights: resident,
                planned_resident_bytes: part.plan.resident_bytes(),
                model_bytes,
                llama_bytes,
                budget: budget.bytes,
            });
        }
        Ok(loaded)
    }
}

impl AcrossLaunch {
    /// Sample the process's memory on each of the plan's devices that
    /// NVML knows; None where it knows none (remote devices, no NVML).
    pub fn sample_peaks(&self) -> Option<engine::MemorySampler> {
        let devices: Vec<engine::Device> = engine::list_devices()
            .into_iter()
            .filter(|d| self.budgets.iter().any(|b| b.index == d.index))
            .collect();
        let cards = engine::nvml_cards(&devices);
        (!cards.is_empty()).then(|| engine::MemorySampler::start(None, cards))
    }

    /// Each sampled device's (name, peak, budget), with a warning where a
    /// peak went over its device's budget.
    pub fn peaks_and_budgets(&self, peaks: Vec<(String, u64)>) -> Vec<(String, u64, u64)> {
        peaks
            .into_iter()
            .map(|(device, peak)| {
                let budget = self.budgets.iter().find(|b| b.device == device).map_or(0, |b| b.bytes);
                if peak > budget {
                    tracing::warn!(
                        "{device}: the process's memory peaked at {}, over its budget of {}",
                        fmt_bytes(peak),
                        fmt_bytes(budget)
                    );
                }
                (device, peak, budget)
            })
            .collect()
    }
}

impl std::fmt::Display for DeviceLoaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (layers {}-{}): {} weights resident as planned, {} planned, {} of weights loaded; llama.cpp's buffers {} of the budget {}",
            self.device,
            self.first_layer,
            self.end_layer.saturating_sub(1),
            self.resident_weights,
            fmt_bytes(self.planned_resident_bytes),
            fmt_bytes(self.model_bytes),
            fmt_bytes(self.llama_bytes),
            fmt_bytes(self.budget)
        )
    }
}
