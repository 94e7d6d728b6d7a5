//! The server's target model across devices (`--vram-budget A=..,B=..`
//! beside upstream's own `--rpc`): planned for the parameters upstream
//! resolved and installed into them, as `pipeshard run` does, and reported
//! per device in `/props` and `/metrics`.

use std::fmt::Write as _;
use std::sync::Arc;

use serde_json::json;

use super::plan::slots_workload;
use super::state::ServerState;
use super::ServeError;
use crate::engine::{self, ContextParams, LoadRequest, ModelParams, OffloadQuery};
use crate::launch::across::{plan_across, AcrossLaunch};
use crate::launch::devices::DeviceBudget;
use crate::launch::{LaunchError, LaunchRequest};
use crate::plan::devices::DevicePart;
use crate::plan::fmt_bytes;

impl ServerState {
    /// Plan the target model across the devices of `budgets` and install
    /// the plan into upstream's parameters.
    pub(super) fn place_across(
        &self,
        req: &LoadRequest,
        mp: &mut ModelParams<'static>,
        cp: &mut ContextParams,
        budgets: Vec<DeviceBudget>,
    ) -> Result<AcrossLaunch, ServeError> {
        let err = |source| ServeError::Plan {
            model: req.model.clone(),
            source,
        };
        if req.draft.is_some() || req.mmproj.is_some() {
            return Err(err(LaunchError::Options(
                "a plan across devices does not take a draft model or a projector yet".into(),
            )));
        }
        let threads = cp.n_threads.unwrap_or_else(engine::default_threads);
        let mut launch_req =
            LaunchRequest::with_budget(&req.model, &self.opts.pipeshard, threads, slots_workload(cp), None)
                .map_err(err)?;
        launch_req.full_slot_prompt = true;
        let launched = plan_across(&launch_req, cp, budgets, |_, _| {}).map_err(err)?;
        let upstream_outputs = cp.n_outputs_max;
        launched.install(mp, cp).map_err(err)?;
        if upstream_outputs != 0 {
            cp.n_outputs_max = cp.n_outputs_max.max(upstream_outputs);
        }
        if let Some(inner) = cp.offload.take() {
            let reports = Arc::clone(&self.reports);
            cp.offload = Some(Arc::new(move |q: &OffloadQuery<'_>| {
                reports.note_ubatch(q.n_tokens);
                inner(q)
            }));
        }
        for (part, budget) in launched.plan.parts.iter().zip(&launched.budgets) {
            tracing::info!(
                "pipeshard plan for {} on {}: layers {}-{}, {} of weights resident, VRAM {} of {}",
                req.model.display(),
                part.device,
                part.first_layer,
                part.end_layer().saturating_sub(1),
                fmt_bytes(part.plan.resident_bytes()),
                fmt_bytes(part.plan.vram.total),
                fmt_bytes(budget.bytes)
            );
        }
        Ok(launched)
    }
}

/// The `plan` of `/props` for a plan across devices.
pub fn props_plan(l: &AcrossLaunch) -> serde_json::Value {
    let devices: Vec<_> = l
        .plan
        .parts
        .iter()
        .zip(&l.budgets)
        .map(|(part, b)| {
            json!({
                "device": part.device,
                "vram_budget": b.bytes,
                "first_layer": part.first_layer,
                "n_layer": part.plan.n_layer,
                "kv_gpu_layers": part.plan.kv_gpu_layers,
                "resident_bytes": part.plan.resident_bytes(),
                "vram": part.plan.vram,
            })
        })
        .collect();
    json!({
        "source": "budget",
        "model": l.plan.model,
        "ubatch": l.plan.ubatch,
        "n_layer": l.plan.n_layer,
        "devices": devices,
        "predicted": l.plan.predicted,
    })
}

/// A per-device gauge's value for a device's part of the plan and its
/// budget; None where it has none.
type DeviceGauge = fn(&DevicePart, &DeviceBudget) -> Option<u64>;

/// `/metrics`' gauges per device, labelled `device`.
pub fn device_metrics(l: &AcrossLaunch) -> String {
    let mut out = String::new();
    let rows: [(&str, &str, DeviceGauge); 5] = [
        (
            "pipeshard_device_vram_budget_bytes",
            "VRAM budget of the device, bytes.",
            |_, b| Some(b.bytes),
        ),
        (
            "pipeshard_device_layers",
            "Model layers the plan puts on the device.",
            |p, _| Some(u64::from(p.plan.n_layer)),
        ),
        (
            "pipeshard_device_plan_resident_bytes",
            "Weight bytes the plan keeps on the device.",
            |p, _| Some(p.plan.resident_bytes()),
        ),
        (
            "pipeshard_device_plan_vram_bytes",
            "Device memory the plan uses on the device (weights, KV cache, compute, reserve), bytes.",
            |p, _| Some(p.plan.vram.total),
        ),
        (
            "pipeshard_device_vram_used_bytes",
            "The process's memory on the device as NVML reports it, bytes (devices NVML knows only).",
            |_, b| own_bytes(b),
        ),
    ];
    for (name, help, value) in rows {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (part, budget) in l.plan.parts.iter().zip(&l.budgets) {
            if let Some(v) = value(part, budget) {
                let _ = writeln!(out, "{name}{{device=\"{}\"}} {v}", part.device);
            }
        }
    }
    out
}

/// The process's memory on `b`'s card, where NVML knows the device.
fn own_bytes(b: &DeviceBudget) -> Option<u64> {
    let device = engine::list_devices().into_iter().find(|d| d.index == b.index)?;
    engine::nvml::device_usage(device.device_id.as_deref()?).map(|u| u.own)
}
