//! `pipeshard plan --vram-budget CUDA0=SIZE,CUDA1=SIZE`: a plan across
//! devices, each with its budget and profile.

use anyhow::Result;
use pipeshard::engine;
use pipeshard::gguf::ModelInfo;
use pipeshard::launch::devices::{self, DeviceBudgetSpec};
use pipeshard::launch::{self, BudgetSpec};
use pipeshard::plan::devices::{make_devices_plan, DeviceShare};
use pipeshard::plan::render_devices;
use pipeshard::profile::MachineProfile;

use super::plan::{resolve_profile, PlanArgs};

/// Plan `info` across the devices `specs` names and print the plan.
pub fn plan_devices(
    args: &PlanArgs,
    info: &ModelInfo,
    threads: i32,
    cp: &engine::ContextParams,
    specs: &[DeviceBudgetSpec],
) -> Result<()> {
    args.budget.check()?;
    let profiles = device_profiles(args, info, threads, specs)?;
    let budgets = device_bytes(args, specs)?;
    let model_path = args.model.clone().unwrap_or_default();
    let req = launch::LaunchRequest {
        model: &model_path,
        options: &args.budget,
        budget: None,
        threads,
        workload: args.workload(),
        ubatch: args.ubatch,
        vision: Default::default(),
        draft: None,
        side_contexts: Vec::new(),
        full_slot_prompt: false,
    };
    let (pr, _) = launch::plan_request(&req, info, cp, 0, &profiles[0]);
    let shares: Vec<DeviceShare<'_>> = specs
        .iter()
        .zip(&budgets)
        .zip(&profiles)
        .map(|((spec, &budget), profile)| DeviceShare {
            device: spec.device.clone(),
            budget,
            profile,
        })
        .collect();
    let plan = make_devices_plan(info, &shares, &pr)?;
    print!("{}", render_devices(&plan, args.format));
    Ok(())
}

/// Each device's profile: from a devices file (`--profile` naming one
/// profile per device), else one profile for every device (`--profile`,
/// or this machine's, whose devices must then exist).
fn device_profiles(
    args: &PlanArgs,
    info: &ModelInfo,
    threads: i32,
    specs: &[DeviceBudgetSpec],
) -> Result<Vec<MachineProfile>> {
    let names: Vec<String> = specs.iter().map(|s| s.device.clone()).collect();
    launch::across::device_profiles(args.budget.profile.as_deref(), &names, || {
        if args.budget.profile.is_none() {
            // Planning for this machine: its devices must exist.
            args.budget.device_budgets()?;
        }
        resolve_profile(&args.budget, threads, info)
    })
}

/// Each device's budget, bytes: sizes as given; `auto` reads the device,
/// which must exist.
fn device_bytes(args: &PlanArgs, specs: &[DeviceBudgetSpec]) -> Result<Vec<u64>> {
    let sizes: Option<Vec<u64>> = specs
        .iter()
        .map(|s| match s.budget {
            BudgetSpec::Bytes(b) => Some(b),
            BudgetSpec::Auto => None,
        })
        .collect();
    if let Some(sizes) = sizes {
        return Ok(sizes);
    }
    let resolved = devices::resolve(specs, args.budget.vram_headroom.as_ref(), &engine::list_devices())?;
    Ok(resolved.into_iter().map(|d| d.bytes).collect())
}
