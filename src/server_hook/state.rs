//! The server's pipeshard state, one per run of the server: the options,
//! the running [`Session`] of the model loaded last, how the vision encoder
//! runs, and what the reports read. Every C hook reaches it through the
//! `user_data` llama.cpp hands back ([`engine::ServerHooks`]), so nothing
//! of it is process-wide.

use std::sync::{Arc, Mutex};

use super::options::ServerOptions;
use super::report::Reports;
use super::ServeError;
use crate::engine::{ContextRef, ServerHooks, ServerReports, VisionOptions};
use crate::launch::devices::BudgetList;
use crate::launch::{BudgetSpec, Session};

pub struct ServerState {
    pub(super) opts: ServerOptions,
    /// The target model's running state, from its load on.
    pub(super) session: Mutex<Option<Session>>,
    /// How the vision encoder runs under the plan, once the projector hook
    /// set it.
    pub(super) vision: Mutex<Option<VisionOptions>>,
    pub(super) reports: Arc<Reports>,
}

impl ServerState {
    /// The state of a server run with `opts`.
    pub fn new(opts: ServerOptions) -> Result<Arc<ServerState>, ServeError> {
        // `auto` resolves when the model loads; the plan reports it then.
        // So do budgets per device, against the devices loaded by then.
        let budget = match opts.pipeshard.budget_list() {
            Ok(Some(BudgetList::Sizes(b))) => match b.as_slice() {
                [BudgetSpec::Bytes(b)] => Some(*b),
                _ => None,
            },
            Ok(_) => None,
            Err(e) => return Err(ServeError::Options(e.to_string())),
        };
        Ok(Arc::new(ServerState {
            opts,
            session: Mutex::new(None),
            vision: Mutex::new(None),
            reports: Arc::new(Reports::new(budget)),
        }))
    }

    /// What `/props` and `/metrics` report.
    pub fn reports(&self) -> &Reports {
        &self.reports
    }

    /// The hooks llama.cpp's server calls, each holding this state: every
    /// model file checked before it loads; with a budget or a plan, the
    /// load placed, the projector run pipeshard's way, the session stepped
    /// between batches, and pipeshard's field in `/props` and gauges in
    /// `/metrics` (with `--metrics`).
    pub fn hooks(self: &Arc<Self>) -> ServerHooks {
        let s = Arc::clone(self);
        let mut hooks = ServerHooks {
            load: Some(Box::new(move |req, mp, cp| {
                super::check_files(req)?;
                s.on_load(req, mp, cp).map_err(|e| e.to_string())
            })),
            ..ServerHooks::default()
        };
        if !self.opts.plans() {
            return hooks;
        }
        let s = Arc::clone(self);
        hooks.projector = Some(Box::new(move |path, p| super::plan::on_projector(&s, path, p)));
        let s = Arc::clone(self);
        hooks.between_batches = Some(Box::new(move |ctx| s.between_batches(ctx)));
        let (p, m) = (Arc::clone(&self.reports), Arc::clone(&self.reports));
        hooks.reports = Some(ServerReports {
            key: "pipeshard".into(),
            props: Box::new(move || p.props_json()),
            metrics: Box::new(move || m.metrics_text()),
        });
        hooks
    }

    /// The server loop's hook, between two batches: the decode split tuned
    /// before the first request, and with `auto` the plan following the
    /// card. A panic that poisoned the session's lock drops the tuning with
    /// the plan's own setting in force.
    fn between_batches(&self, mut ctx: ContextRef<'_>) {
        let mut g = match self.session.lock() {
            Ok(g) => g,
            Err(poisoned) => {
                let mut g = poisoned.into_inner();
                if let Some(s) = g.as_mut() {
                    s.abandon_served_tuning(ctx.reborrow());
                }
                g
            }
        };
        if let Some(s) = g.as_mut() {
            s.between_batches(ctx);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use pipeshard_devtools::synth::{model_info, Quant};
    use serde_json::Value;

    use super::*;
    use crate::engine::ContextParams;
    use crate::launch::{Launch, ProcessOverhead, SplitKnob};
    use crate::plan::{make_plan, PlanRequest};
    use crate::profile::MachineProfile;
    use crate::server_hook::Installed;

    fn state(args: &[&str]) -> Arc<ServerState> {
        let own: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        ServerState::new(ServerOptions::parse(&own).unwrap()).unwrap()
    }

    /// R2's launch at 4 GiB on the H200 host's profile, which leaves a
    /// decode split to tune.
    fn launch() -> Launch {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h200-machine-profile.yaml");
        let profile = MachineProfile::load(&fixture).unwrap();
        let info = model_info("qwen3-30b-a3b", Quant::Q4_0).unwrap();
        let plan = make_plan(&info, &profile, &PlanRequest::new(4 << 30, 4352)).unwrap();
        Launch {
            budget: plan.vram.budget,
            overhead: ProcessOverhead::for_machine(Some(&profile), 4352),
            replan: None,
            split_knob: SplitKnob::of(&plan, info.n_expert_used, false),
            plan,
        }
    }

    fn props(hooks: &ServerHooks) -> Value {
        serde_json::from_str(&(hooks.reports.as_ref().unwrap().props)()).unwrap()
    }

    fn metrics(hooks: &ServerHooks) -> String {
        (hooks.reports.as_ref().unwrap().metrics)()
    }

    /// Two servers in one process: each one's hooks reach its own state,
    /// so the plan installed, the ubatch noted and the session stepping in
    /// one are nowhere in the other.
    #[test]
    fn two_servers_in_one_process_share_no_state() {
        let (a, b) = (state(&["--vram-budget", "4GiB"]), state(&["--vram-budget", "6GiB"]));
        let (ha, hb) = (a.hooks(), b.hooks());
        let launch = launch();
        let mut session = Session::new(&launch);
        session.tune_before_serving(&ContextParams::default());
        assert!(session.tune_pending());
        let installed = Installed {
            plan: launch.plan.clone(),
            budget: Some(launch.budget),
            from_file: false,
            draft_on_gpu: None,
        };
        a.reports.install(installed, None);
        a.reports.note_ubatch(1);
        *a.session.lock().unwrap() = Some(session);

        let (pa, pb) = (props(&ha), props(&hb));
        assert_eq!(pa["plan"]["model"], Value::from(launch.plan.model.clone()));
        assert_eq!(pa["vram_budget"], Value::from(launch.budget));
        assert_eq!(pb["plan"], Value::Null);
        assert_eq!(pb["vram_budget"], Value::from(6u64 << 30));
        let (ma, mb) = (metrics(&ha), metrics(&hb));
        let resident = launch.plan.resident_bytes();
        assert!(resident > 0);
        assert!(
            ma.contains(&format!("pipeshard_plan_resident_bytes {resident}\n")),
            "{ma}"
        );
        assert!(!ma.contains("pipeshard_plan_tier 0\n"), "{ma}");
        assert!(mb.contains("pipeshard_plan_resident_bytes 0\n"), "{mb}");
        assert!(mb.contains("pipeshard_plan_tier 0\n"), "{mb}");
        assert!(
            mb.contains(&format!("pipeshard_vram_budget_bytes {}\n", 6u64 << 30)),
            "{mb}"
        );
        assert!(b.reports.installed().is_none());
        assert!(b.session.lock().unwrap().is_none());
        // A split tuned in one server is reported by that one alone.
        let tuned = crate::launch::tune::with_setting(&launch.plan, launch.split_knob.unwrap().planned());
        a.reports.plan_changed(&tuned, 3 << 30);
        b.reports.plan_changed(&tuned, 5 << 30);
        assert_eq!(props(&ha)["vram_budget"], Value::from(3u64 << 30));
        assert_eq!(props(&hb)["plan"], Value::Null);
    }
}
