//! The decode split of the ubatch a server's slots decode together (one
//! token of each of `-np N` sequences), chosen before the first request as
//! [`super::tune::tune_served`] chooses the single-token one, and held
//! beside it: the plan's [`Plan::batch_gpu_experts`] is asked for ubatches
//! of that tier alone, so the server switches between the two settings
//! with each batch's size, at no cost (a ubatch of another size builds its
//! own graph anyway).
//!
//! A step of N tokens on N sequences routes to the union of their experts:
//! with real text's routing (the calibrated band of `moe-routing.md`) four
//! sequences share few of them, so R2's 4-token step streaming them took 95
//! ms on an H200 host, four times the single-token step the tuner had
//! timed, and four clients decoded 42.6 tok/s in total (call
//! 2026-11-29-j, server-np4).

use super::tune::{search_split_within, time_each_step, SplitKnob, SplitProbe, SplitSetting, SplitTuning};
use super::tune::{served_prompt, SERVED_DEPTH, SERVED_LIMIT};
use super::{LaunchError, Session};
use crate::engine::{ContextRef, EngineError, Token};
use crate::plan::Plan;

/// The knob of the N-token ubatch of `plan`'s sequences decoding together,
/// where the single-token split is the experts' `knob` and several
/// sequences decode together: N, and the GPU's experts per token from the
/// plan's for that ubatch (0: every routed expert streamed).
pub fn batch_knob(knob: SplitKnob, plan: &Plan) -> Option<(u32, SplitKnob)> {
    let n = plan.workload.decode_tokens();
    match knob {
        SplitKnob::Experts { max, .. } if n > 1 => Some((
            n,
            SplitKnob::Experts {
                start: plan.batch_gpu_experts,
                max,
            },
        )),
        _ => None,
    }
}

/// `plan` with the split of its several sequences' ubatch at `setting`.
pub fn with_batch_setting(plan: &Plan, setting: SplitSetting) -> Plan {
    let mut p = plan.clone();
    if let SplitSetting::Experts(k) = setting {
        p.batch_gpu_experts = k;
    }
    p
}

/// Choose the split of the N-token ubatch on a server's context before it
/// serves a request: a synthetic prompt in sequence 0 ([`SERVED_DEPTH`]
/// tokens at most), copied to sequences 1 to N-1, then for each setting
/// decode steps of one token of each sequence, each sequence's own (from a
/// first token of its own, so that even the model's own router routes them
/// apart); within [`SERVED_LIMIT`]; every cell removed after. `stream` is
/// the context's streaming slots and routed threshold, set again to rebuild
/// its graphs. Not where a sequence holds cells already, the context has
/// fewer than N sequences, or a sequence's context is too short; where a
/// step fails the plan's setting stays in force. Each case is logged.
pub fn tune_served_batch(session: &mut Session, mut ctx: ContextRef<'_>, stream: (u32, u32)) -> Option<SplitTuning> {
    let (n, knob) = session.batch_knob.take()?;
    let steps = (super::tune::SETTLE_STEPS + super::tune::TIMED_STEPS) as u32;
    let held = (0..ctx.n_seq_max() as i32).any(|s| ctx.seq_pos_max(s) >= 0);
    let depth = SERVED_DEPTH
        .min(session.plan.workload.prompt_tokens.min(u32::MAX as u64) as u32)
        .min(ctx.n_ctx_seq().saturating_sub(steps));
    if held || depth == 0 || ctx.n_seq_max() < n {
        tracing::info!(
            "decode split of {n}-token steps: not tuned (a sequence holds cells, or the context is too small); the plan's {} stays",
            knob.planned()
        );
        return None;
    }
    tracing::info!(
        "decode split of {n}-token steps: tuning before the first request, from the plan's {}: a {depth}-token prompt in {n} sequences, then {steps} steps of one token of each per setting (at most {} s)",
        knob.planned(),
        SERVED_LIMIT.as_secs()
    );
    let n_vocab = ctx.n_vocab().max(2) as u64;
    let prompt = served_prompt(depth, ctx.n_vocab());
    let decoded = {
        let mut seq0 = ctx.seq0();
        seq0.decode(&prompt, 0, false).map(|()| seq0.synchronize())
    };
    let searched = decoded.map_err(LaunchError::from).and_then(|()| {
        // Within the context's sequences, checked above.
        for s in 1..n as i32 {
            ctx.seq_cp(0, s);
        }
        let mut probe = BatchProbe {
            session: &*session,
            ctx: ctx.reborrow(),
            stream,
            n,
            depth,
            n_vocab,
        };
        search_split_within(knob, &mut probe, Some(SERVED_LIMIT))
    });
    for s in 0..n as i32 {
        if !ctx.seq_rm(s, 0, -1) {
            tracing::warn!("decode split of {n}-token steps: sequence {s} could not be emptied after tuning");
        }
    }
    match searched {
        Ok(tuning) => {
            tracing::info!("decode split of {n}-token steps: {tuning}");
            session.plan = with_batch_setting(&session.plan, tuning.chosen);
            Some(tuning)
        }
        Err(e) => {
            tracing::warn!(
                "decode split of {n}-token steps: not tuned, keeping the plan's {}: {e}",
                knob.planned()
            );
            session.switch.switch(&session.plan);
            ctx.set_stream_slots(stream.0, stream.1);
            None
        }
    }
}

/// A server's context between two batches: steps of one token of each of
/// sequences 0 to `n - 1`, at `depth`.
struct BatchProbe<'a, 'c> {
    session: &'a Session,
    ctx: ContextRef<'c>,
    stream: (u32, u32),
    n: u32,
    depth: u32,
    n_vocab: u64,
}

impl SplitProbe for BatchProbe<'_, '_> {
    fn put_in_force(&mut self, setting: SplitSetting) {
        self.session
            .switch
            .switch(&with_batch_setting(&self.session.plan, setting));
        self.ctx.set_stream_slots(self.stream.0, self.stream.1);
    }

    fn time_steps(&mut self) -> Result<f64, LaunchError> {
        let (ctx, depth, n_vocab) = (&mut self.ctx, self.depth, self.n_vocab as Token);
        // Each sequence's first token its own.
        let mut tokens: Vec<Token> = (0..self.n as Token).map(|s| (1 + 7919 * s) % n_vocab).collect();
        let timed = time_each_step(|i, _| {
            ctx.decode_each_seq(&tokens, (depth + i) as i32)?;
            for (s, t) in tokens.iter_mut().enumerate() {
                *t = ctx.greedy_ith(s as i32).map_or(*t + 1, |g| g) % n_vocab;
            }
            Ok(tokens[0])
        });
        for s in 0..self.n as i32 {
            if !self.ctx.seq_rm(s, self.depth as i32, -1) {
                return Err(LaunchError::Engine(EngineError::SeqState(format!(
                    "sequence {s} cannot go back to the depth {} (a recurrent state)",
                    self.depth
                ))));
            }
        }
        timed
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use pipeshard_devtools::synth::{model_info, Quant};

    use super::*;
    use crate::launch::tune::{search_split, with_setting};
    use crate::plan::{apply::policies, make_plan, PlanRequest};
    use crate::profile::MachineProfile;

    /// R2 Q4_0 at 4 GiB with four slots decoding together (`-np 4 -c
    /// 17408`, no `--kv-unified`) on the committed H200 profile.
    fn r2_np4() -> Plan {
        let profile = MachineProfile::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml"),
        )
        .unwrap();
        let info = model_info("qwen3-30b-a3b", Quant::Q4_0).unwrap();
        let mut req = PlanRequest::new(4 << 30, 17408);
        req.workload.parallel = 4;
        req.kv_unified = false;
        make_plan(&info, &profile, &req).unwrap()
    }

    /// Recorded step times behind the probe seam, by the ubatch's size:
    /// each probe times a step of `n` tokens with the experts per token
    /// that the plan in force's policy gives that size, as the graph asks
    /// it; `in_force` is put there by `apply` (the tuner's setting on the
    /// plan).
    struct Recorded {
        plan: Plan,
        in_force: Plan,
        apply: fn(&Plan, SplitSetting) -> Plan,
        n: u32,
        layer: u32,
        ms: fn(u32, u32) -> f64,
    }

    impl SplitProbe for Recorded {
        fn put_in_force(&mut self, setting: SplitSetting) {
            self.in_force = (self.apply)(&self.plan, setting);
        }

        fn time_steps(&mut self) -> Result<f64, LaunchError> {
            let k = policies(&self.in_force).moe_split.map_or(0, |f| f(self.layer, self.n));
            Ok((self.ms)(self.n, k) / 1e3)
        }
    }

    /// Per step: the single-token times the server measured before its
    /// first request (call 2026-11-29-j, server-np4: 7 fastest), and for
    /// the 4-token step its 95 ms streamed (k = 0, what four clients got),
    /// and a host where 4 on the GPU is fastest beside the CPU.
    fn h200(n: u32, k: u32) -> f64 {
        let one = [50.69, 37.91, 36.54, 32.07, 30.78, 26.31, 27.61, 25.15];
        let four = [95.4, 90.0, 80.0, 70.0, 62.0, 66.0, 74.0, 84.0];
        if n == 1 {
            one[k as usize]
        } else {
            four[k as usize]
        }
    }

    #[test]
    fn each_step_size_keeps_its_own_fastest_split() {
        let plan = r2_np4();
        assert_eq!(plan.workload.decode_tokens(), 4);
        let knob = SplitKnob::of(&plan, 8, false).expect("a hybrid plan");
        let (n, batch) = batch_knob(knob, &plan).expect("several sequences");
        assert_eq!((n, batch.planned()), (4, SplitSetting::Experts(plan.batch_gpu_experts)));
        let layer = plan
            .tensors
            .iter()
            .find(|t| t.role.ends_with("Exps") && !t.resident)
            .and_then(|t| t.layer)
            .unwrap();
        // The single-token search first, as the server runs it.
        let mut one = Recorded {
            in_force: plan.clone(),
            plan: plan.clone(),
            apply: with_setting,
            n: 1,
            layer,
            ms: h200,
        };
        let tuned = search_split(knob, &mut one).unwrap();
        assert_eq!(tuned.chosen, SplitSetting::Experts(7));
        let plan = with_setting(&plan, tuned.chosen);
        // Then the 4-token step's, on the plan the first chose.
        let mut four = Recorded {
            in_force: plan.clone(),
            plan: plan.clone(),
            apply: with_batch_setting,
            n: 4,
            layer,
            ms: h200,
        };
        let tuned = search_split(batch, &mut four).unwrap();
        assert_eq!(tuned.measured.len(), 8, "every share, streamed (0) among them");
        assert_eq!(tuned.chosen, SplitSetting::Experts(4));
        // Both are held: each ubatch size is answered with its own.
        let served = with_batch_setting(&plan, tuned.chosen);
        let split = policies(&served).moe_split.unwrap();
        assert_eq!((split(layer, 1), split(layer, 4), split(layer, 4096)), (7, 4, 0));
        // A single sequence has no such step.
        let mut alone = served.clone();
        alone.workload.parallel = 1;
        assert_eq!(batch_knob(knob, &alone), None);
    }

    #[test]
    fn a_4_token_step_streamed_fastest_is_kept_streamed() {
        // Where the 4-token step routes few distinct experts (the synthetic
        // router: on the H200 streaming every expert was fastest, 57-61
        // tok/s for four clients against 39 split; CHANGELOG.md, session
        // 8), the search keeps them streamed.
        let plan = r2_np4();
        let knob = SplitKnob::of(&plan, 8, false).unwrap();
        let (_, batch) = batch_knob(knob, &plan).unwrap();
        let layer = plan
            .tensors
            .iter()
            .find(|t| t.role.ends_with("Exps"))
            .and_then(|t| t.layer)
            .unwrap();
        let mut four = Recorded {
            in_force: plan.clone(),
            plan: plan.clone(),
            apply: with_batch_setting,
            n: 4,
            layer,
            ms: |_, k| 67.0 + 5.0 * k as f64,
        };
        let tuned = search_split(batch, &mut four).unwrap();
        assert_eq!(tuned.chosen, SplitSetting::Experts(0));
        let served = with_batch_setting(&plan, tuned.chosen);
        let offload = policies(&served).offload;
        let name = plan
            .tensors
            .iter()
            .find(|t| t.layer == Some(layer) && t.role.ends_with("Exps"))
            .unwrap();
        let q = crate::engine::OffloadQuery {
            weight: &name.name,
            op: crate::engine::OpKind::MulMatId,
            n_tokens: 4,
        };
        assert_eq!(offload(&q), crate::engine::Offload::Gpu, "streamed");
    }
}
