//! The decode split chosen at run time: the cost model's share of the
//! CPU/GPU split (hybrid experts, patch 0006; dense row split, patch 0017)
//! and the others around it (every expert count, the neighbouring row
//! shares) are timed over a few decode steps after load, and the fastest is
//! kept.
//!
//! The best share depends on the host more than the cost model can know: it
//! is set by how fast the CPU's part runs beside the link's copies, which
//! varied by 1.07–1.6 times the profile's samples between H200 hosts (R2 at
//! 4 GiB: share 4 fastest on one host, 57.7 tok/s against 52.8–54.8 for the
//! model's 5; share 5 fastest on another, CHANGELOG.md, session 12).
//!
//! [`ShareSearch`] is the choice alone, fed with measured step times (CPU
//! tested); [`tune_split`] measures them on a loaded context.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{LaunchError, Session};
use crate::engine::{Context, ContextRef, Seq0, Seq0Mark, Token};
use crate::plan::{set_row_split, Plan, RowSplit};

/// The knob a plan's decode split turns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SplitKnob {
    /// Hybrid experts: how many of each token's routed experts the GPU
    /// computes (0 to `n_expert_used - 1`; at 0 the CPU computes them all,
    /// the graph's own path).
    Experts { start: u32, max: u32 },
    /// Dense row split: the GPU's share of each host feed-forward weight's
    /// rows, in units of [`ROW_SHARE_UNIT`] from the plan's.
    Rows { start: f64 },
    /// Dense row split with ffn_down streamed whole (the plan's mode,
    /// [`Plan::row_split_down_whole`]): the GPU's share of up's and gate's
    /// rows, in units of [`ROW_SHARE_UNIT`] from the plan's. The mode stays:
    /// the plan no longer holds ffn_down's split.
    RowsDownWhole { start: f64 },
}

/// The unit of a row share's offset: the search climbs in steps of
/// [`ROW_CLIMB_UNITS`] of it, then tries one unit either side of the
/// fastest.
pub const ROW_SHARE_UNIT: f64 = 0.025;
/// Units per step of the row shares' climb (5%).
pub const ROW_CLIMB_UNITS: i32 = 2;
/// The least row share on either side (the GPU's and the CPU's).
const ROW_SHARE_MIN: f64 = 0.05;
/// The least GPU share of up's and gate's rows with ffn_down streamed
/// whole, one unit ([`crate::plan::row_split::DOWN_WHOLE_LEAST_SHARE`]).
const WHOLE_SHARE_MIN: f64 = crate::plan::row_split::DOWN_WHOLE_LEAST_SHARE;
/// Offsets from this one up name [`SplitSetting::RowsDownWhole`] at
/// `(offset - WHOLE_BASE)` units of [`ROW_SHARE_UNIT`] (a share, not an
/// offset from the plan's).
const WHOLE_BASE: i32 = 1 << 16;
/// Settings with ffn_down streamed whole that a row search measures, at
/// most, after its climb. Its climb ends by itself once both ways are
/// slower (3-4 probes from a start near the fastest); the cap leaves room
/// for a start far from it. With 4, one search on an H200 host started at
/// 37.5% (its row climb had stopped at a noisy 58%), was still getting
/// faster at 22.5% when it stopped, and kept 22.5%: 26.5 tok/s, where the
/// same host's other searches kept 5-15% at 28-31 (CHANGELOG.md, session 23,
/// call b).
const WHOLE_PROBES: usize = 8;
/// Probes more of each of the two settings a row search weighs last (the
/// climb's choice and the fastest with ffn_down streamed whole),
/// alternately: the host drifts while a search runs (on an H200 host one
/// setting's probes within one search read 32.48, 34.42 and 33.85 ms,
/// CHANGELOG.md, session 23, call b), so that a choice between settings
/// measured seconds apart is the host's more than theirs.
const CONFIRM_PROBES: usize = 2;
/// The finalists are confirmed only where their first probes are within
/// this fraction of each other (twice a probe's noise, [`PLATEAU`]).
const CONFIRM_WITHIN: f64 = 0.10;
/// A climb walks on past settings within this fraction of the fastest: one
/// probe's median of 8 steps differs by up to ±5% between neighbouring
/// shares on one host, and on an H100 host 54% measured 2.3% slower than
/// the cost model's 59%, which held the climb there, where 39-44% ran
/// 10-20% faster (CHANGELOG.md, session 22, call k).
const PLATEAU: f64 = 0.05;

/// One setting of a [`SplitKnob`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SplitSetting {
    Experts(u32),
    Rows(f64),
    /// The row split with ffn_down streamed whole in decode: the share is
    /// up's and gate's. The CPU then computes one part per layer and hands
    /// over to the GPU once instead of twice. R1 at 2 GiB decoded 3-5%
    /// faster so on an H100 host, with 5-15% of up's and gate's rows on the
    /// GPU, than with 40-45% of every weight's (CHANGELOG.md, session 22).
    RowsDownWhole(f64),
}

impl std::fmt::Display for SplitSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SplitSetting::Experts(k) => write!(f, "hybrid experts {k}"),
            SplitSetting::Rows(s) => write!(f, "row split {}% GPU", percent(*s)),
            SplitSetting::RowsDownWhole(s) => {
                write!(
                    f,
                    "row split {}% GPU of up and gate, ffn_down streamed whole",
                    percent(*s)
                )
            }
        }
    }
}

/// A share as a percentage, with a decimal only where it has one (52.5).
fn percent(share: f64) -> String {
    let p = (share * 1000.0).round() / 10.0;
    if p.fract() == 0.0 {
        format!("{p:.0}")
    } else {
        format!("{p:.1}")
    }
}

impl SplitKnob {
    /// The knob `plan` can turn at run time, if any. A plan without a split,
    /// an exact plan (GPU math only), or a share the user forced has none.
    pub fn of(plan: &Plan, n_expert_used: u32, forced: bool) -> Option<SplitKnob> {
        if forced || plan.exact {
            return None;
        }
        if plan.has_hybrid_layers() && plan.hybrid_gpu_experts > 0 && n_expert_used >= 3 {
            return Some(SplitKnob::Experts {
                start: plan.hybrid_gpu_experts,
                max: n_expert_used - 1,
            });
        }
        let split = plan.tensors.iter().any(|t| !t.resident && !t.gpu_share.is_empty());
        let start = plan.row_split_share;
        (split && start > 0.0).then_some(if plan.row_split_down_whole {
            SplitKnob::RowsDownWhole { start }
        } else {
            SplitKnob::Rows { start }
        })
    }

    /// The plan's own setting (offset 0), whether or not within the range
    /// the search walks: the optimizer may plan any share (R1 Q4_K_M plans
    /// 98.5% at 3.5 GiB on tests/fixtures/gpu-machine-profile.yaml).
    pub fn planned(&self) -> SplitSetting {
        match *self {
            SplitKnob::Experts { start, .. } => SplitSetting::Experts(start),
            SplitKnob::Rows { start } => SplitSetting::Rows(start),
            SplitKnob::RowsDownWhole { start } => SplitSetting::RowsDownWhole(start),
        }
    }

    /// The setting `offset` units from the plan's (an expert, or
    /// [`ROW_SHARE_UNIT`] of the rows): the plan's own at 0
    /// ([`SplitKnob::planned`]), others if within the knob's range: 0 to
    /// `max` experts, a row share from 5% to 95%. Offsets from
    /// [`WHOLE_BASE`] up are row shares with ffn_down streamed whole, from
    /// 2.5% ([`WHOLE_SHARE_MIN`]) to 95%.
    pub fn setting(&self, offset: i32) -> Option<SplitSetting> {
        let (lo, hi) = (ROW_SHARE_MIN - 1e-9, 1.0 - ROW_SHARE_MIN + 1e-9);
        if offset == 0 {
            return Some(self.planned());
        }
        match *self {
            SplitKnob::Experts { start, max } => {
                let k = start as i64 + offset as i64;
                (offset < WHOLE_BASE && (0..=max as i64).contains(&k)).then_some(SplitSetting::Experts(k as u32))
            }
            SplitKnob::Rows { .. } if offset >= WHOLE_BASE => {
                let s = (offset - WHOLE_BASE) as f64 * ROW_SHARE_UNIT;
                (WHOLE_SHARE_MIN - 1e-9..=hi)
                    .contains(&s)
                    .then_some(SplitSetting::RowsDownWhole(s))
            }
            SplitKnob::Rows { start } => {
                let s = start + offset as f64 * ROW_SHARE_UNIT;
                (lo..=hi).contains(&s).then_some(SplitSetting::Rows(s))
            }
            SplitKnob::RowsDownWhole { start } => {
                let s = start + offset as f64 * ROW_SHARE_UNIT;
                (offset < WHOLE_BASE && (WHOLE_SHARE_MIN - 1e-9..=hi).contains(&s))
                    .then_some(SplitSetting::RowsDownWhole(s))
            }
        }
    }

    /// Units per step of a climb over this knob's settings.
    fn climb_units(&self) -> i32 {
        match self {
            SplitKnob::Experts { .. } => 1,
            SplitKnob::Rows { .. } | SplitKnob::RowsDownWhole { .. } => ROW_CLIMB_UNITS,
        }
    }
}

/// `plan` with its decode split set to `setting`: the experts the GPU
/// computes, or the row split ([`crate::plan::set_row_split`]); nothing
/// else (the residency and memory stay the plan's).
pub fn with_setting(plan: &Plan, setting: SplitSetting) -> Plan {
    let mut p = plan.clone();
    match setting {
        SplitSetting::Experts(k) => p.hybrid_gpu_experts = k,
        SplitSetting::Rows(share) => set_row_split(
            &mut p,
            RowSplit {
                share,
                down_whole: false,
            },
        ),
        SplitSetting::RowsDownWhole(share) => set_row_split(
            &mut p,
            RowSplit {
                share,
                down_whole: true,
            },
        ),
    }
    p
}

/// A search over a knob's settings, from the cost model's (offset 0).
/// Either every setting in the knob's range, nearest first (an experts
/// knob, whose range is small), or a hill climb from the fastest so far:
/// each way, a step past the settings measured within [`PLATEAU`] of it,
/// until both ways end at a slower setting (or the range's end); where a
/// step is more than one unit (row shares: 5% steps of 2.5% units), then
/// the settings one unit either side of the fastest. At most `max_probes`
/// settings are measured. A row search then climbs over the shares of up
/// and gate with ffn_down streamed whole ([`SplitSetting::RowsDownWhole`],
/// at most [`WHOLE_PROBES`]). Another setting replaces the cost model's
/// only when it is faster by more than `margin` (a fraction), and the
/// climb's choice replaces the fastest with ffn_down whole only when faster
/// than it by more than `margin`, so that noise does not move the choice
/// (see [`ShareSearch::best_offset`]); the climb
/// itself goes on from the fastest and across plateaus, so that a share as
/// fast as the cost model's does not stop it short of a faster one (R1 on
/// H100 hosts: 59% and 54% within 2.3% of each other, 40% 15% faster;
/// session 22).
///
/// The row shares' climb must reach far from the cost model's share: with
/// patch 0042's CPU kernel, R1 at 2 GiB decoded at 27.6-28.5 tok/s at 48%
/// on an H200 host, against 25.1-26.0 at 53%, where the model chose 73%
/// and a climb of 5 probes ended (CHANGELOG.md, session 21, calls c and d);
/// on another host the search kept 35.5-38% (29.0-32.2 tok/s).
///
/// The hybrid experts' step time need not fall and rise once around the
/// best share: with the expert cache (patch 0040) an expert the GPU
/// computes again costs no copy, so more GPU experts can be faster by far
/// where one fewer was slower within the noise. On an H100 host a climb
/// went 5, 4, 3 and stopped, and never timed 7, which took 40% less per
/// step there (CHANGELOG.md, session 18).
#[derive(Debug, Clone)]
pub struct ShareSearch {
    knob: SplitKnob,
    max_probes: usize,
    margin: f64,
    /// Every setting, not a climb.
    every: bool,
    /// Seconds per decode step, by offset.
    measured: BTreeMap<i32, f64>,
    /// The confirming probes' seconds per step, in the order measured
    /// ([`CONFIRM_PROBES`]).
    confirmed: Vec<(i32, f64)>,
}

impl ShareSearch {
    /// The search the launch runs, with a 2% margin: every setting of an
    /// experts knob, a climb of at most 12 row shares.
    pub fn new(knob: SplitKnob) -> ShareSearch {
        match knob {
            SplitKnob::Experts { max, .. } => ShareSearch {
                every: true,
                ..ShareSearch::with_limits(knob, max as usize + 1, 0.02)
            },
            SplitKnob::Rows { .. } | SplitKnob::RowsDownWhole { .. } => ShareSearch::with_limits(knob, 12, 0.02),
        }
    }

    /// A climb of at most `max_probes` settings.
    pub fn with_limits(knob: SplitKnob, max_probes: usize, margin: f64) -> ShareSearch {
        ShareSearch {
            knob,
            max_probes: max_probes.max(1),
            margin: margin.max(0.0),
            every: false,
            measured: BTreeMap::new(),
            confirmed: Vec::new(),
        }
    }

    /// The offset to measure next, and its setting; None once the choice
    /// is made.
    pub fn next(&self) -> Option<(i32, SplitSetting)> {
        if !self.measured.contains_key(&0) {
            return self.knob.setting(0).map(|s| (0, s));
        }
        if self.every {
            if self.measured.len() >= self.max_probes {
                return None;
            }
            // Nearest first, the larger share before the smaller.
            return (1..=self.max_probes as i32)
                .flat_map(|d| [d, -d])
                .filter(|o| !self.measured.contains_key(o))
                .find_map(|o| self.knob.setting(o).map(|s| (o, s)));
        }
        let climbed = self.measured.range(..WHOLE_BASE).count();
        if climbed < self.max_probes {
            if let Some(next) = self.climb(false) {
                return Some(next);
            }
        }
        self.next_whole().or_else(|| self.next_confirm())
    }

    /// The two settings a row search weighs last: the climb's choice and
    /// the fastest with ffn_down streamed whole, if it measured any.
    fn finalists(&self) -> Option<(i32, i32)> {
        let w = self.fastest_offset(true)?;
        Some((self.climb_choice(), w))
    }

    /// Once the climbs are done, more probes of the finalists where their
    /// first probes are close ([`CONFIRM_WITHIN`]), alternately from the one
    /// with ffn_down whole, until each has [`CONFIRM_PROBES`] more.
    fn next_confirm(&self) -> Option<(i32, SplitSetting)> {
        let (o, w) = self.finalists()?;
        let (t_o, t_w) = (self.measured[&o], self.measured[&w]);
        // False where either is unusable (infinite): nothing to confirm.
        let close = (t_w - t_o).abs() <= CONFIRM_WITHIN * t_o;
        if !close {
            return None;
        }
        let count = |x: i32| self.confirmed.iter().filter(|c| c.0 == x).count();
        let (n_o, n_w) = (count(o), count(w));
        let next = if n_w <= n_o && n_w < CONFIRM_PROBES {
            w
        } else if n_o < CONFIRM_PROBES {
            o
        } else {
            return None;
        };
        self.knob.setting(next).map(|s| (next, s))
    }

    /// The seconds per step of offset `o` that the choice compares: the
    /// median of its probe and its confirming probes (taken alternately
    /// with the other finalist's, so that the host's drift weighs on both
    /// alike), so that one slow probe does not decide. On an H200 host
    /// ffn_down whole at 12.5% read 33.58, then 33.86 and 38.37 ms, and 48%
    /// of every weight 37.04, 36.10 and 36.99: the confirming probes' means
    /// (36.1 against 36.5) kept every weight split, and that run decoded
    /// 25.6-26.1 tok/s (CHANGELOG.md, session 23, call d).
    fn choice_time(&self, o: i32) -> f64 {
        let mut all: Vec<f64> = self
            .measured
            .get(&o)
            .into_iter()
            .copied()
            .chain(self.confirmed.iter().filter(|c| c.0 == o).map(|c| c.1))
            .collect();
        if all.is_empty() {
            f64::INFINITY
        } else {
            median(&mut all)
        }
    }

    /// The next setting of a climb over the climb's offsets or (`whole`)
    /// the settings with ffn_down streamed whole: from the fastest of them,
    /// each way a step past those measured within [`PLATEAU`] of it (a
    /// plateau, where a share only as fast may lead to a faster one); then,
    /// where a step is more than one unit, one unit either side of the
    /// fastest (with ffn_down whole: 2.5% below a fastest 5%).
    fn climb(&self, whole: bool) -> Option<(i32, SplitSetting)> {
        let best = self.fastest_offset(whole)?;
        let step = self.knob.climb_units();
        let within = self.measured[&best] * (1.0 + PLATEAU);
        let beyond = |dir: i32| {
            let mut o = best + dir * step;
            while self.measured.get(&o).is_some_and(|&t| t <= within) {
                o += dir * step;
            }
            (!self.measured.contains_key(&o))
                .then(|| self.knob.setting(o).map(|s| (o, s)))
                .flatten()
        };
        let open = |d: i32| {
            [best - d, best + d]
                .into_iter()
                .filter(|o| !self.measured.contains_key(o))
                .find_map(|o| self.knob.setting(o).map(|s| (o, s)))
        };
        match (beyond(-1), beyond(1)) {
            (Some(lo), Some(hi)) => Some(if best - lo.0 <= hi.0 - best { lo } else { hi }),
            (lo, hi) => lo.or(hi),
        }
        .or_else(|| if step > 1 { open(1) } else { None })
    }

    /// After a row share climb, the settings with ffn_down streamed whole
    /// (at most [`WHOLE_PROBES`]): first the share of up and gate that puts
    /// as many of the split weights' bytes on the link as the fastest row
    /// share (ffn_down holds a third of them), at least 5%, then a climb
    /// (down to [`WHOLE_SHARE_MIN`]).
    fn next_whole(&self) -> Option<(i32, SplitSetting)> {
        if !matches!(self.knob, SplitKnob::Rows { .. }) {
            return None;
        }
        let n = self.measured.range(WHOLE_BASE..).count();
        if n >= WHOLE_PROBES {
            return None;
        }
        if n > 0 {
            return self.climb(true);
        }
        let Some(SplitSetting::Rows(f)) = self.fastest_offset(false).and_then(|o| self.knob.setting(o)) else {
            return None;
        };
        let share = ((3.0 * f - 1.0) / 2.0).max(ROW_SHARE_MIN);
        let o = WHOLE_BASE + (share / ROW_SHARE_UNIT).round() as i32;
        self.knob.setting(o).map(|s| (o, s))
    }

    /// Record the seconds per decode step measured at `offset` (a
    /// confirming probe where it was measured before); a time that is not a
    /// positive number counts as unusable (never the fastest).
    pub fn record(&mut self, offset: i32, secs_per_step: f64) {
        let t = if secs_per_step.is_finite() && secs_per_step > 0.0 {
            secs_per_step
        } else {
            f64::INFINITY
        };
        match self.measured.entry(offset) {
            Entry::Occupied(_) => self.confirmed.push((offset, t)),
            Entry::Vacant(v) => {
                v.insert(t);
            }
        }
    }

    /// The fastest offset measured (the nearest of equals) among the
    /// climb's or (`whole`) those with ffn_down streamed whole, where a
    /// climb goes on from: a share within the margin of the cost model's
    /// may still lead to a faster one beyond it.
    fn fastest_offset(&self, whole: bool) -> Option<i32> {
        let range = if whole {
            self.measured.range(WHOLE_BASE..)
        } else {
            self.measured.range(..WHOLE_BASE)
        };
        range
            .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.abs().cmp(&b.0.abs())))
            .map(|(&o, _)| o)
    }

    /// The climb's choice: its fastest, the cost model's (0) unless
    /// another is faster by more than the margin.
    fn climb_choice(&self) -> i32 {
        let Some(&start) = self.measured.get(&0) else {
            return 0;
        };
        let o = self.fastest_offset(false).unwrap_or(0);
        if self.measured[&o] < start * (1.0 - self.margin) {
            o
        } else {
            0
        }
    }

    /// The offset chosen: the fastest with ffn_down streamed whole, unless
    /// the climb's choice is faster than it by more than the margin, each
    /// by its confirming probes where it has them. Within the margin
    /// ffn_down whole wins: it hands over between the CPU and the GPU once
    /// per layer instead of twice, and the runs whose finalists probed
    /// alike and that kept every weight split decoded slower than their
    /// hosts' runs that kept ffn_down whole. On an
    /// H200 host with medians of 35.00 ms (ffn_down whole) and 35.17 ms
    /// (43% of every weight), the run kept 43% and decoded 27.8 and 25.8
    /// tok/s, where the same host's runs that kept ffn_down whole decoded
    /// 27.9-29.6 (CHANGELOG.md, session 23, call e); in session 22 (call j)
    /// one that kept 33% at 0.7% faster decoded 25.1-25.4, the others
    /// 27.9-32.1.
    pub fn best_offset(&self) -> i32 {
        let Some((o, w)) = self.finalists() else {
            return self.climb_choice();
        };
        let (t_o, t_w) = (self.choice_time(o), self.choice_time(w));
        if t_w.is_finite() && t_o >= t_w * (1.0 - self.margin) {
            w
        } else {
            o
        }
    }

    /// The chosen setting.
    pub fn best(&self) -> SplitSetting {
        self.knob
            .setting(self.best_offset())
            .unwrap_or_else(|| self.knob.planned())
    }

    /// Every setting measured, with its seconds per step, by offset; then
    /// the confirming probes in the order measured.
    pub fn measured(&self) -> Vec<(SplitSetting, f64)> {
        self.measured
            .iter()
            .map(|(&o, &t)| (o, t))
            .chain(self.confirmed.iter().copied())
            .filter_map(|(o, t)| self.knob.setting(o).map(|s| (s, t)))
            .collect()
    }
}

/// What [`tune_split`] chose.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitTuning {
    /// The cost model's setting.
    pub planned: SplitSetting,
    /// The setting kept.
    pub chosen: SplitSetting,
    /// Each setting measured and its median seconds per decode step.
    pub measured: Vec<(SplitSetting, f64)>,
    /// Seconds the whole search took.
    pub elapsed_s: f64,
}

impl std::fmt::Display for SplitTuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (the cost model's: {}; measured", self.chosen, self.planned)?;
        for (i, (s, t)) in self.measured.iter().enumerate() {
            let v = match s {
                SplitSetting::Experts(k) => k.to_string(),
                SplitSetting::Rows(r) => format!("{}%", percent(*r)),
                SplitSetting::RowsDownWhole(r) => format!("{}% with ffn_down whole", percent(*r)),
            };
            write!(f, "{} {v}: {:.2} ms", if i == 0 { "" } else { "," }, t * 1e3)?;
        }
        write!(f, " per step, in {:.2} s)", self.elapsed_s)
    }
}

/// Decode steps run after a setting is put in force before timing: the
/// first builds, splits and reserves the graph again, the next let the
/// CUDA backend capture its graph again.
pub(super) const SETTLE_STEPS: usize = 3;
/// Decode steps timed per setting (their median is its time).
pub(super) const TIMED_STEPS: usize = 8;

/// What a split search measures on: a loaded context in `run` and `bench`
/// ([`tune_split`]), recorded step times in tests.
pub trait SplitProbe {
    /// Put `setting` in force (its graphs are rebuilt at the next step).
    fn put_in_force(&mut self, setting: SplitSetting);
    /// Seconds per decode step of the setting in force.
    fn time_steps(&mut self) -> Result<f64, LaunchError>;
}

/// Search `knob`'s settings on `probe` ([`ShareSearch`]) and leave the
/// chosen one in force. Where a measurement fails, the plan's own setting
/// is put back in force, never a probe's, and the error returned.
pub fn search_split(knob: SplitKnob, probe: &mut impl SplitProbe) -> Result<SplitTuning, LaunchError> {
    search_split_within(knob, probe, None)
}

/// [`search_split`], ended after `limit` where one is given: the choice is
/// then made among the settings measured by then (the plan's first).
pub fn search_split_within(
    knob: SplitKnob,
    probe: &mut impl SplitProbe,
    limit: Option<Duration>,
) -> Result<SplitTuning, LaunchError> {
    let started = Instant::now();
    let mut search = ShareSearch::new(knob);
    while let Some((offset, setting)) = search.next() {
        if limit.is_some_and(|l| started.elapsed() > l) {
            tracing::info!(
                "decode split: the search stopped at its limit of {:.0} s, after {} settings",
                limit.unwrap_or_default().as_secs_f64(),
                search.measured().len()
            );
            break;
        }
        probe.put_in_force(setting);
        match probe.time_steps() {
            Ok(t) => {
                tracing::debug!("decode split: {setting}: {:.2} ms per step", t * 1e3);
                search.record(offset, t);
            }
            Err(e) => {
                probe.put_in_force(knob.planned());
                return Err(e);
            }
        }
    }
    let chosen = search.best();
    probe.put_in_force(chosen);
    Ok(SplitTuning {
        planned: knob.planned(),
        chosen,
        measured: search.measured(),
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// Choose `session`'s decode split on the loaded `ctx`: time decode steps of
/// sequence 0 at position `depth` and after (the sequence goes back to
/// `depth` before the next setting, [`Seq0::rewind`]) for the settings
/// [`ShareSearch`] asks for, through the session's policy switch, and keep
/// the fastest in force (its graphs are rebuilt at the next decode). Does
/// nothing (None) for a plan with no knob ([`super::Launch::split_knob`]) or
/// one tuned already. `depth` cells of sequence 0 must be in the cache
/// already; they are kept, except those a short context needs for the
/// steps. Where a step fails, the plan's setting stays in force and the log
/// says why (None); the sequence may then hold other cells.
pub fn tune_split(
    session: &mut Session,
    ctx: &mut Context<'_>,
    depth: u32,
) -> Result<Option<SplitTuning>, LaunchError> {
    let Some(knob) = session.split_knob else {
        return Ok(None);
    };
    // The steps must fit the context at the depth: a shallower one keeps
    // the first cells.
    let steps = (SETTLE_STEPS + TIMED_STEPS) as u32;
    let n_ctx = ctx.n_ctx();
    let depth = depth.min(n_ctx.saturating_sub(steps));
    if depth == 0 {
        tracing::info!("decode split: not tuned, the context ({n_ctx} cells) is too short for {steps} decode steps");
        return Ok(None);
    }
    let stream = ctx.stream_params();
    let mut seq0 = ctx.seq0();
    if !seq0.seq_rm(depth as i32, -1) {
        tracing::warn!(
            "decode split: not tuned, keeping the plan's {}: {steps} decode steps need the context ({n_ctx} cells) to drop sequence 0's positions from {depth} on, which its memory cannot (a recurrent state)",
            knob.planned()
        );
        return Ok(None);
    }
    session.split_knob = None;
    match search_on_seq0(session, knob, &mut seq0, stream, None) {
        Ok(tuning) => {
            tracing::info!("decode split: {tuning}");
            session.plan = with_setting(&session.plan, tuning.chosen);
            Ok(Some(tuning))
        }
        Err(e) => {
            tracing::warn!("decode split: not tuned, keeping the plan's {}: {e}", knob.planned());
            Ok(None)
        }
    }
}

/// [`search_split_within`] on decode steps of `seq0` after the positions
/// it holds, marked first and gone back to after each setting's steps.
/// `stream` is the context's streaming slots and routed threshold, set
/// again to rebuild its graphs.
fn search_on_seq0(
    session: &Session,
    knob: SplitKnob,
    seq0: &mut Seq0<'_>,
    stream: (u32, u32),
    limit: Option<Duration>,
) -> Result<SplitTuning, LaunchError> {
    let mark = seq0.mark()?;
    let n_vocab = seq0.n_vocab().max(2) as u64;
    let mut probe = Seq0Probe {
        session,
        seq0,
        stream,
        mark,
        n_vocab,
    };
    search_split_within(knob, &mut probe, limit)
}

/// Decode steps of a context's sequence 0 after its `mark`.
struct Seq0Probe<'a, 'c> {
    session: &'a Session,
    seq0: &'a mut Seq0<'c>,
    stream: (u32, u32),
    mark: Seq0Mark,
    n_vocab: u64,
}

impl SplitProbe for Seq0Probe<'_, '_> {
    fn put_in_force(&mut self, setting: SplitSetting) {
        self.session.switch.switch(&with_setting(&self.session.plan, setting));
        self.seq0.context().set_stream_slots(self.stream.0, self.stream.1);
    }

    fn time_steps(&mut self) -> Result<f64, LaunchError> {
        let (seq0, depth, n_vocab) = (&mut *self.seq0, self.mark.depth() as i32, self.n_vocab);
        let timed = time_each_step(|i, tok| {
            seq0.decode(&[tok], depth + i as i32, true)?;
            // Reading the output waits for the step; it is the next input,
            // as in greedy decoding, so the routed experts vary as they do
            // there. Where the context keeps no logits (upstream's backend
            // sampling), the step is waited for and the next token taken.
            let next = seq0.greedy(-1).unwrap_or_else(|| {
                seq0.synchronize();
                tok + 1
            });
            Ok((next as u64 % n_vocab) as Token)
        });
        // The steps' positions go, whether or not they all ran.
        let rewound = self.seq0.rewind(&self.mark);
        let t = timed?;
        rewound?;
        Ok(t)
    }
}

/// Median seconds of `step(i, token)` (decode step `i` of `token`, waited
/// for; returns the next token) over [`TIMED_STEPS`], after
/// [`SETTLE_STEPS`].
pub(super) fn time_each_step(
    mut step: impl FnMut(u32, Token) -> Result<Token, LaunchError>,
) -> Result<f64, LaunchError> {
    let mut times = Vec::with_capacity(TIMED_STEPS);
    let mut tok: Token = 1;
    for i in 0..SETTLE_STEPS + TIMED_STEPS {
        let t = Instant::now();
        tok = step(i as u32, tok)?;
        if i >= SETTLE_STEPS {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(median(&mut times))
}

/// The median of `v` (the mean of the middle two for an even count).
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The depth of the prompt a server's tuning decodes before its steps:
/// the reference prompt's (4096 tokens), at most what sequence 0 holds, so
/// that the search's time stays bounded for long contexts.
pub(super) const SERVED_DEPTH: u32 = 4096;
/// The longest a server's search runs before it chooses among the settings
/// measured: R1 at 2 GiB on an H200 host measures ~24 settings of 11 steps
/// at ~40 ms each, ~11 s.
pub(super) const SERVED_LIMIT: Duration = Duration::from_secs(60);

/// The synthetic prompt of `depth` tokens that a server's tuning decodes
/// before its steps: tokens spread over a vocabulary of `n_vocab`.
pub(super) fn served_prompt(depth: u32, n_vocab: i32) -> Vec<Token> {
    let n_vocab = n_vocab.max(2) as u64;
    (0..depth as u64)
        .map(|i| ((i * 7919 + 1) % (n_vocab - 1)) as Token)
        .collect()
}

/// Choose `session`'s decode split on a server's context `ctx` before it
/// serves a request, as [`tune_split`] does for `run` and `bench`: a
/// synthetic prompt of sequence 0 ([`SERVED_DEPTH`] tokens at most), then
/// decode steps after it for each setting, within [`SERVED_LIMIT`]; the
/// cells are removed after. `stream` is the context's streaming slots and
/// routed threshold, set again to rebuild its graphs. Not where a sequence
/// holds cells already, nor in a context too short for the steps; where a
/// step fails the plan's setting stays in force. Each case is logged.
pub fn tune_served(session: &mut Session, mut ctx: ContextRef<'_>, stream: (u32, u32)) -> Option<SplitTuning> {
    let knob = session.split_knob.take()?;
    let steps = (SETTLE_STEPS + TIMED_STEPS) as u32;
    let held = (0..ctx.n_seq_max() as i32).any(|s| ctx.seq_pos_max(s) >= 0);
    let mut seq0 = ctx.seq0();
    let depth = SERVED_DEPTH
        .min(session.plan.workload.prompt_tokens.min(u32::MAX as u64) as u32)
        .min(seq0.n_ctx_seq().saturating_sub(steps));
    if held || depth == 0 {
        let why = if held {
            "the context holds a sequence already".to_string()
        } else {
            format!(
                "a sequence's context ({} cells) is too short for {steps} decode steps",
                seq0.n_ctx_seq()
            )
        };
        tracing::info!("decode split: not tuned, {why}; the plan's {} stays", knob.planned());
        return None;
    }
    tracing::info!(
        "decode split: tuning before the first request, from the plan's {}: a {depth}-token prompt, then {steps} decode steps per setting (at most {} s)",
        knob.planned(),
        SERVED_LIMIT.as_secs()
    );
    let prompt = served_prompt(depth, seq0.n_vocab());
    let searched = seq0
        .decode(&prompt, 0, true)
        .map_err(LaunchError::from)
        .and_then(|()| search_on_seq0(session, knob, &mut seq0, stream, Some(SERVED_LIMIT)));
    if !seq0.seq_rm(-1, -1) {
        tracing::warn!("decode split: the tuning's cells of sequence 0 could not be removed");
    }
    match searched {
        Ok(tuning) => {
            tracing::info!("decode split: {tuning}");
            session.plan = with_setting(&session.plan, tuning.chosen);
            Some(tuning)
        }
        Err(e) => {
            tracing::warn!("decode split: not tuned, keeping the plan's {}: {e}", knob.planned());
            session.switch.switch(&session.plan);
            seq0.context().set_stream_slots(stream.0, stream.1);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `search` the step times `ms(setting)` until it chooses; the
    /// settings in the order measured.
    fn run(search: &mut ShareSearch, ms: impl Fn(SplitSetting) -> f64) -> Vec<SplitSetting> {
        let mut order = Vec::new();
        while let Some((o, s)) = search.next() {
            order.push(s);
            search.record(o, ms(s) / 1e3);
            assert!(
                order.len() <= 12 + WHOLE_PROBES + 2 * CONFIRM_PROBES,
                "the search does not end"
            );
        }
        order
    }

    fn experts(table: &[(u32, f64)]) -> impl Fn(SplitSetting) -> f64 + '_ {
        move |s| match s {
            SplitSetting::Experts(k) => table.iter().find(|(n, _)| *n == k).map_or(1e9, |x| x.1),
            _ => unreachable!(),
        }
    }

    /// Step times (ms) of the row shares from `rows`; every setting with
    /// ffn_down streamed whole far slower.
    fn rows_only(rows: impl Fn(f64) -> f64) -> impl Fn(SplitSetting) -> f64 {
        move |x| match x {
            SplitSetting::Rows(f) => rows(f),
            SplitSetting::RowsDownWhole(_) => 1e3,
            _ => unreachable!(),
        }
    }

    /// The row shares in `order`, in tenths of a percent: those with every
    /// weight split, or (`whole`) those of up and gate with ffn_down
    /// streamed whole.
    fn shares(order: &[SplitSetting], whole: bool) -> Vec<i64> {
        order
            .iter()
            .filter_map(|x| match (x, whole) {
                (SplitSetting::Rows(f), false) | (SplitSetting::RowsDownWhole(f), true) => {
                    Some((f * 1000.0).round() as i64)
                }
                _ => None,
            })
            .collect()
    }

    /// `setting` streams ffn_down whole with `share` of up's and gate's
    /// rows on the GPU.
    fn assert_whole(setting: SplitSetting, share: f64) {
        match setting {
            SplitSetting::RowsDownWhole(s) => assert!((s - share).abs() < 1e-9, "{s}"),
            other => panic!("{other:?}"),
        }
    }

    /// `setting` splits every weight at `share`.
    fn assert_rows(setting: SplitSetting, share: f64) {
        match setting {
            SplitSetting::Rows(f) => assert!((f - share).abs() < 1e-9, "{f}"),
            other => panic!("{other:?}"),
        }
    }

    const R2: SplitKnob = SplitKnob::Experts { start: 5, max: 7 };

    #[test]
    fn each_host_gets_its_fastest_share() {
        // Host times per step (ms) as session 12 measured them: share 4
        // fastest on call 1's host, 5 on call 2's.
        let host1 = [(3, 19.5), (4, 16.5), (5, 18.1), (6, 20.9), (7, 23.2)];
        let mut s = ShareSearch::new(R2);
        let order = run(&mut s, experts(&host1));
        // Every setting, nearest first.
        assert_eq!(order, [5, 6, 4, 7, 3, 2, 1, 0].map(SplitSetting::Experts));
        assert_eq!(s.best(), SplitSetting::Experts(4));

        let host2 = [(3, 23.4), (4, 22.4), (5, 19.6), (6, 21.0), (7, 23.3)];
        let mut s = ShareSearch::new(R2);
        run(&mut s, experts(&host2));
        assert_eq!(s.best(), SplitSetting::Experts(5));
        assert_eq!(s.measured().len(), 8);

        // A climb from 5 on host 1 goes on below 4, not above 5.
        let mut s = ShareSearch::with_limits(R2, 5, 0.02);
        let order = run(&mut s, experts(&host1));
        assert_eq!(order, [5, 4, 3].map(SplitSetting::Experts));
        assert_eq!(s.best(), SplitSetting::Experts(4));
    }

    #[test]
    fn a_share_past_a_slower_neighbour_is_still_found() {
        // An H100 host with the expert cache (CHANGELOG.md, session 18,
        // c-r2-on-4 and c-r2-on-3): 4 within the noise of 5, 3 slower, and 7
        // far faster than all of them.
        let h100 = [(3, 18.09), (4, 15.27), (5, 15.68), (6, 12.44), (7, 9.9)];
        let mut s = ShareSearch::with_limits(R2, 5, 0.02);
        run(&mut s, experts(&h100));
        // 5 is within 5% of 4: the climb walks on to 6 and 7.
        assert_eq!(s.best(), SplitSetting::Experts(7));
        let mut s = ShareSearch::new(R2);
        run(&mut s, experts(&h100));
        assert_eq!(s.best(), SplitSetting::Experts(7));
    }

    #[test]
    fn noise_within_the_margin_keeps_the_cost_models_share() {
        let flat = [(4, 17.9), (5, 18.0), (6, 17.8)];
        let mut s = ShareSearch::new(R2);
        run(&mut s, experts(&flat));
        assert_eq!(s.best(), SplitSetting::Experts(5));
        // 3% faster is a real difference.
        let better = [(4, 17.4), (5, 18.0), (6, 18.5), (3, 19.0)];
        let mut s = ShareSearch::new(R2);
        run(&mut s, experts(&better));
        assert_eq!(s.best(), SplitSetting::Experts(4));
    }

    #[test]
    fn the_climb_follows_a_slope_within_its_probes_and_range() {
        // Faster with every expert fewer on the GPU: it walks down towards
        // the range's end, 0 experts (the CPU computes them all).
        let slope = [
            (1, 15.0),
            (2, 16.0),
            (3, 17.0),
            (4, 18.0),
            (5, 19.0),
            (6, 20.0),
            (7, 21.0),
        ];
        let mut s = ShareSearch::with_limits(R2, 5, 0.02);
        let order = run(&mut s, experts(&slope));
        assert_eq!(order, [5, 4, 3, 2, 1].map(SplitSetting::Experts));
        assert_eq!(s.best(), SplitSetting::Experts(1));
        // At most `max_probes` settings.
        let mut s = ShareSearch::with_limits(R2, 3, 0.02);
        let order = run(&mut s, experts(&slope));
        assert_eq!(order, [5, 4, 3].map(SplitSetting::Experts));
        assert_eq!(s.best(), SplitSetting::Experts(3));
        // At the top of the range there is one neighbour.
        let top = SplitKnob::Experts { start: 7, max: 7 };
        let mut s = ShareSearch::with_limits(top, 5, 0.02);
        let order = run(&mut s, experts(&slope));
        assert_eq!(order[..2], [SplitSetting::Experts(7), SplitSetting::Experts(6)]);
        // Every setting from the top: the range's 7, down to 0.
        let mut s = ShareSearch::new(top);
        let order = run(&mut s, experts(&slope));
        assert_eq!(order, [7, 6, 5, 4, 3, 2, 1, 0].map(SplitSetting::Experts));
        assert_eq!(s.best(), SplitSetting::Experts(1));
    }

    #[test]
    fn the_cpu_computing_every_expert_is_timed_and_kept_where_fastest() {
        // R3 (gpt-oss-20b, MXFP4, 4 GiB) on one H200 host (calls
        // 2026-11-29-g and -h): the plan's 3 of 4 experts on the GPU and
        // the settings below it took 34.9-37.6 ms per step, every host
        // expert on the CPU (--hybrid-experts 0) 27.9 ms.
        let r3 = SplitKnob::Experts { start: 3, max: 3 };
        let host = [(0, 27.9), (1, 37.6), (2, 37.3), (3, 34.9)];
        let mut s = ShareSearch::new(r3);
        let order = run(&mut s, experts(&host));
        assert_eq!(order, [3, 2, 1, 0].map(SplitSetting::Experts));
        assert_eq!(s.best(), SplitSetting::Experts(0));
    }

    #[test]
    fn a_failed_measurement_is_never_chosen() {
        let mut s = ShareSearch::new(R2);
        s.record(0, 0.018);
        s.record(-1, f64::NAN);
        s.record(1, 0.0);
        assert_eq!(s.best(), SplitSetting::Experts(5));
        assert!(s.measured().iter().any(|(_, t)| t.is_infinite()));
    }

    #[test]
    fn row_shares_step_from_the_models_within_the_rows() {
        let k = SplitKnob::Rows { start: 0.78 };
        // in tenths of a percent
        let s = |o| match k.setting(o) {
            Some(SplitSetting::Rows(f)) => Some((f * 1000.0).round() as i64),
            _ => None,
        };
        assert_eq!(
            (s(-2), s(-1), s(0), s(1), s(2), s(6)),
            (Some(730), Some(755), Some(780), Some(805), Some(830), Some(930))
        );
        assert_eq!(s(7), None, "95.5% leaves the CPU less than 5%");
        assert_eq!(s(-30), None);
        // R1's hosts (CHANGELOG.md, session 9): 70% fastest against the
        // model's 75-78%. The climb steps by 5% (78, 73, 68, 63), then tries
        // 2.5% either side of 68%, and 5% either side of the faster 70.5%.
        let ms = rows_only(|f| 46.0 + 400.0 * (f - 0.70) * (f - 0.70));
        let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.78 });
        let order = shares(&run(&mut search, ms), false);
        // 63% and 65.5% are within 5% of the fastest, so the walk goes on
        // to 58% and 60.5%; 75.5%, to 80.5%.
        assert_eq!(order, [780, 730, 680, 630, 580, 655, 705, 755, 605, 805]);
        assert_rows(search.best(), 0.705);
    }

    #[test]
    fn the_row_climb_reaches_far_below_the_models_share() {
        // R1 at 2 GiB on an H200 host with patch 0042 (CHANGELOG.md,
        // session 21): the cost model's 73%, fastest at 48%. Step times
        // (ms) fall 0.55 per point of share down to 48% (73%: 49.4) and
        // rise 0.3 per point below it (43%: 37.1), as measured.
        let h200 = |f: f64| {
            let p = f * 100.0;
            if p >= 48.0 {
                35.6 + 0.55 * (p - 48.0)
            } else {
                35.6 + 0.3 * (48.0 - p)
            }
        };
        let ms = rows_only(h200);
        let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.73 });
        let order = run(&mut search, &ms);
        let rows = order.iter().filter(|x| matches!(x, SplitSetting::Rows(_))).count();
        assert_eq!(rows, 10, "{order:?}");
        assert_rows(search.best(), 0.48);
        // The old limit of 5 probes stopped at 53%.
        let mut five = ShareSearch::with_limits(SplitKnob::Rows { start: 0.73 }, 5, 0.02);
        run(&mut five, ms);
        assert_eq!(five.best(), SplitSetting::Rows(0.73 - 0.20));
        assert_eq!(SplitSetting::Rows(0.525).to_string(), "row split 52.5% GPU");
        assert_eq!(SplitSetting::Rows(0.48).to_string(), "row split 48% GPU");
    }

    #[test]
    fn the_row_climb_crosses_a_plateau_within_the_margin() {
        // R1 at 2 GiB on an H100 host (CHANGELOG.md, session 22, calls a
        // and b): the cost model's 59% and 54% measured 41.38 and 40.60 ms
        // (1.9% apart, within the margin) in one search, 41.47 and 41.53
        // in another, while 40% ran at ~35 ms. A climb from the share it
        // would choose stopped at 59% in both, one from the fastest in the
        // second.
        let h100 = |f: f64| {
            let p = f * 100.0;
            if p >= 59.0 {
                41.47 + 0.59 * (p - 59.0)
            } else if p >= 54.0 {
                41.53 - 0.012 * (p - 54.0)
            } else if p >= 39.0 {
                35.0 + 0.435 * (p - 39.0)
            } else {
                35.0 + 0.2 * (39.0 - p)
            }
        };
        let ms = rows_only(h100);
        let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.59 });
        let order = shares(&run(&mut search, ms), false);
        assert_eq!(order, [590, 540, 640, 490, 440, 390, 340, 290, 365, 415]);
        assert_rows(search.best(), 0.39);
        // Call k: 54% measured 2.3% slower than 59%, 56.5% 15% slower (one
        // probe's noise), and 39% fastest (38.21 ms).
        let k = rows_only(|f| {
            let p = (f * 1000.0).round() as i64;
            match p {
                540 => 42.52,
                565 => 47.88,
                590 => 41.57,
                615 => 45.43,
                640 => 43.56,
                _ if p < 390 => 38.21 + 0.02 * (390 - p) as f64,
                _ => 38.21 + 0.029 * (p - 390) as f64,
            }
        });
        let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.59 });
        run(&mut search, k);
        assert_rows(search.best(), 0.39);
        // Where nothing beyond the plateau is faster, the margin still
        // keeps the cost model's share.
        let flat = rows_only(|f| 41.0 - 2.0 * (0.59 - f).clamp(0.0, 0.05));
        let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.59 });
        run(&mut search, flat);
        assert_eq!(search.best(), SplitSetting::Rows(0.59));
    }

    #[test]
    fn a_row_search_tries_ffn_down_streamed_whole_after_its_climb() {
        // R1 at 2 GiB on an H100 host (CHANGELOG.md, session 22, call i):
        // every weight split, fastest near 39-45%; ffn_down streamed whole
        // with 5-15% of up's and gate's rows on the GPU, 3-5% faster.
        let rows = |f: f64| 35.0 + 20.0 * (f - 0.39).abs();
        let whole = |best: f64| {
            move |x: SplitSetting| match x {
                SplitSetting::Rows(f) => rows(f),
                SplitSetting::RowsDownWhole(s) => best + 20.0 * (s - 0.10).abs(),
                _ => unreachable!(),
            }
        };
        let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.59 });
        let order = run(&mut search, whole(33.3));
        let tried = shares(&order, true);
        // From the share that puts as many bytes on the link as 39% of
        // every weight's rows: (3 x 39% - 1) / 2 = 8.5%, 7.5% in units; a
        // climb in 5% steps across the plateau within 5%, then one unit
        // either side of the fastest, which finds 10%. Then the finalists
        // again, alternately, as 10% is within 10% of 39%.
        assert_eq!(tried, [75, 25, 125, 175, 225, 50, 100, 150, 100, 100]);
        let first_whole = order
            .iter()
            .position(|x| matches!(x, SplitSetting::RowsDownWhole(_)))
            .unwrap();
        assert!(order[..first_whole].iter().all(|x| matches!(x, SplitSetting::Rows(_))));
        let n = order.len();
        assert_eq!(shares(&order[n - 4..], false), [390, 390]);
        assert!(matches!(order[n - 4], SplitSetting::RowsDownWhole(_)));
        assert!(matches!(order[n - 2], SplitSetting::RowsDownWhole(_)));
        assert_whole(search.best(), 0.10);
        assert!(search.best().to_string().ends_with("ffn_down streamed whole"));
        // Within the margin either way, ffn_down whole is kept: 1% faster,
        // and 1% slower.
        for best in [34.65, 35.35] {
            let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.59 });
            run(&mut search, whole(best));
            assert_whole(search.best(), 0.10);
        }
        // Every weight stays split where that is faster by more than the
        // margin.
        let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.59 });
        run(&mut search, whole(36.5));
        assert_rows(search.best(), 0.39);
        // The search of experts has no such settings.
        assert_eq!(SplitKnob::Experts { start: 5, max: 7 }.setting(WHOLE_BASE + 4), None);
        assert_whole(SplitKnob::Rows { start: 0.5 }.setting(WHOLE_BASE + 1).unwrap(), 0.025);
        assert_eq!(
            SplitKnob::Rows { start: 0.5 }.setting(WHOLE_BASE),
            None,
            "0% is below the least share"
        );
    }

    #[test]
    fn a_whole_climb_from_a_far_start_goes_on_while_it_gets_faster() {
        // R1 at 2 GiB on an H200 host (CHANGELOG.md, session 23, call b, run
        // 5): the row climb from the cost model's 73% stopped at 58%, which
        // measured 38.78 ms against its neighbours' 43-46 (noise), so the
        // settings with ffn_down whole started at 37.5% and got faster at
        // every step down to 22.5%, the 4th probe and then the last. Below
        // 22.5% the times are run 1's on the same host.
        let rows = |f: f64| match (f * 1000.0).round() as i64 {
            530 => 43.06,
            555 => 44.65,
            580 => 38.78,
            605 => 46.03,
            630 => 41.49,
            680 => 44.66,
            730 => 47.19,
            _ => 45.0,
        };
        let whole = |s: f64| match (s * 1000.0).round() as i64 {
            75 => 30.72,
            125 => 32.03,
            175 => 34.50,
            225 => 35.58,
            275 => 37.25,
            325 => 40.40,
            375 => 43.01,
            _ => 45.0,
        };
        let ms = |x: SplitSetting| match x {
            SplitSetting::Rows(f) => rows(f),
            SplitSetting::RowsDownWhole(s) => whole(s),
            _ => unreachable!(),
        };
        let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.73 });
        let order = run(&mut search, ms);
        let mut climbed = shares(&order, false);
        climbed.sort();
        assert_eq!(climbed, [530, 555, 580, 605, 630, 680, 730]);
        let tried = shares(&order, true);
        assert_eq!(tried, [375, 325, 275, 225, 175, 125, 75, 25]);
        assert_whole(search.best(), 0.075);
    }

    #[test]
    fn a_whole_climb_tries_the_least_share_below_a_fastest_five_percent() {
        // R1 at 2 GiB on an H200 host (CHANGELOG.md, session 24, call b, run
        // 2): with ffn_down whole, 5% probed 28.56 ms and 10% 30.41, where
        // the search stopped at its least share then. Each unit of up and
        // gate on the GPU costs link time; below 5% is one unit, 2.5%.
        let ms = |x: SplitSetting| match x {
            SplitSetting::Rows(f) => 31.5 + 40.0 * (f - 0.18).abs(),
            SplitSetting::RowsDownWhole(s) => 28.56 + 37.0 * (s - 0.05),
            _ => unreachable!(),
        };
        let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.73 });
        let order = run(&mut search, ms);
        assert!(shares(&order, true).contains(&25), "{order:?}");
        assert_whole(search.best(), 0.025);
    }

    #[test]
    fn the_finalists_are_confirmed_alternately_on_a_drifting_host() {
        // A host that slows down as the search runs, 1.5% more per probe (on
        // an H200 host one setting's probes within one search read 32.48,
        // 34.42 and 33.85 ms: CHANGELOG.md, session 23, call b). Every
        // weight split is fastest at 39% (35 ms); ffn_down whole with 7.5%
        // of up and gate on the GPU is 4% faster (33.5 ms), yet its first
        // probe, a dozen probes later, reads slower.
        let probes = std::cell::Cell::new(0);
        let drifting = |x: SplitSetting| {
            let base = match x {
                SplitSetting::Rows(f) => 35.0 + 20.0 * (f - 0.39).abs(),
                SplitSetting::RowsDownWhole(s) => 33.5 + 20.0 * (s - 0.075).abs(),
                _ => unreachable!(),
            };
            probes.set(probes.get() + 1);
            base * (1.0 + 0.015 * probes.get() as f64)
        };
        let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.59 });
        let order = run(&mut search, drifting);
        let whole = |s: &SplitSetting| matches!(s, SplitSetting::RowsDownWhole(_));
        let first_whole = order.iter().position(whole).unwrap();
        let times = search.measured();
        let first = |pick: &dyn Fn(&SplitSetting) -> bool| times.iter().find(|(s, _)| pick(s)).unwrap().1;
        assert!(
            first(&|s| matches!(s, SplitSetting::RowsDownWhole(v) if (v - 0.075).abs() < 1e-9))
                > first(&|s| matches!(s, SplitSetting::Rows(v) if (v - 0.39).abs() < 1e-9)),
            "the first probes mislead: {times:?}"
        );
        // Two more of each, alternately, from ffn_down whole.
        let n = order.len();
        assert!(first_whole < n - 4);
        assert_eq!(
            order[n - 4..].iter().map(whole).collect::<Vec<_>>(),
            [true, false, true, false]
        );
        assert_whole(search.best(), 0.075);
        // Without the confirming probes the first ones would have chosen
        // every weight split.
        let mut unconfirmed = search.clone();
        unconfirmed.confirmed.clear();
        assert_rows(unconfirmed.best(), 0.39);
    }

    #[test]
    fn one_slow_confirming_probe_does_not_decide() {
        // R1 at 2 GiB on an H200 host (CHANGELOG.md, session 23, call d, the
        // search from 58%): the finalists 48% of every weight and 12.5% of
        // up and gate with ffn_down whole, each probe in the order
        // measured. The rows elsewhere are slower, and so are the other
        // whole settings.
        let rows = [37.04, 36.10, 36.99];
        let whole = [33.58, 33.86, 38.37];
        let (r, w) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        let next = |c: &std::cell::Cell<usize>, v: &[f64]| {
            let i = c.get();
            c.set(i + 1);
            v[i.min(v.len() - 1)]
        };
        let ms = |x: SplitSetting| match x {
            SplitSetting::Rows(f) if (f - 0.48).abs() < 1e-9 => next(&r, &rows),
            SplitSetting::Rows(f) => 38.5 + 40.0 * (f - 0.48).abs(),
            SplitSetting::RowsDownWhole(s) if (s - 0.125).abs() < 1e-9 => next(&w, &whole),
            SplitSetting::RowsDownWhole(s) => 34.3 + 40.0 * (s - 0.125).abs(),
            _ => unreachable!(),
        };
        let mut search = ShareSearch::new(SplitKnob::Rows { start: 0.58 });
        run(&mut search, ms);
        assert_eq!((r.get(), w.get()), (3, 3), "{:?}", search.measured());
        assert_whole(search.best(), 0.125);
    }

    /// Recorded step times behind the probe seam: `ms(setting in force)`
    /// per probe, and a failed decode at probe `fail_at` (1-based).
    struct Recorded<F> {
        ms: F,
        in_force: SplitSetting,
        probes: usize,
        fail_at: Option<usize>,
    }

    impl<F: Fn(SplitSetting) -> f64> Recorded<F> {
        fn new(knob: SplitKnob, ms: F) -> Recorded<F> {
            Recorded {
                ms,
                in_force: knob.planned(),
                probes: 0,
                fail_at: None,
            }
        }
    }

    impl<F: Fn(SplitSetting) -> f64> SplitProbe for Recorded<F> {
        fn put_in_force(&mut self, setting: SplitSetting) {
            self.in_force = setting;
        }

        fn time_steps(&mut self) -> Result<f64, LaunchError> {
            self.probes += 1;
            if self.fail_at == Some(self.probes) {
                return Err(crate::engine::EngineError::Decode { code: 1 }.into());
            }
            Ok((self.ms)(self.in_force) / 1e3)
        }
    }

    /// R1 at 2 GiB on an H200 host (CHANGELOG.md, session 24, call b): every
    /// weight split fastest near 18%, ffn_down whole fastest at 5%.
    fn r1_h200(x: SplitSetting) -> f64 {
        match x {
            SplitSetting::Rows(f) => 31.5 + 40.0 * (f - 0.18).abs(),
            SplitSetting::RowsDownWhole(s) => 28.56 + 37.0 * (s - 0.05).abs(),
            SplitSetting::Experts(_) => unreachable!(),
        }
    }

    #[test]
    fn a_planned_share_outside_the_knobs_range_is_searched_from() {
        // The optimizer plans any share on its grid of 0.5% (R1 Q4_K_M at
        // 2 GiB planned one the knob's 5-95% did not hold, and `bench`
        // panicked). The plan's own setting is offset 0 of any knob.
        for start in [0.005, 0.03, 0.965, 1.0] {
            let knob = SplitKnob::Rows { start };
            assert_eq!(knob.setting(0), Some(SplitSetting::Rows(start)));
            let mut probe = Recorded::new(knob, r1_h200);
            let t = search_split(knob, &mut probe).expect("recorded times do not fail");
            assert_eq!(t.planned, SplitSetting::Rows(start));
            assert_eq!(probe.in_force, t.chosen, "{start}");
            assert_whole(t.chosen, 0.05);
            assert!(t.measured.iter().any(|(s, _)| *s == SplitSetting::Rows(start)));
        }
        // A saved plan may hold more GPU experts than the search's range.
        let knob = SplitKnob::Experts { start: 8, max: 7 };
        let mut probe = Recorded::new(knob, |x| match x {
            SplitSetting::Experts(k) => 20.0 + (k as f64 - 6.0).abs(),
            _ => unreachable!(),
        });
        let t = search_split(knob, &mut probe).unwrap();
        assert_eq!(
            (t.planned, t.chosen),
            (SplitSetting::Experts(8), SplitSetting::Experts(6))
        );
    }

    #[test]
    fn a_failed_probe_leaves_the_plans_setting_in_force() {
        for fail_at in [1, 2, 5] {
            let knob = SplitKnob::Rows { start: 0.73 };
            let mut probe = Recorded::new(knob, r1_h200);
            probe.fail_at = Some(fail_at);
            assert!(search_split(knob, &mut probe).is_err());
            assert_eq!(probe.in_force, SplitSetting::Rows(0.73), "failed at {fail_at}");
        }
    }

    #[test]
    fn a_search_past_its_limit_chooses_among_what_it_measured() {
        // With no time left the plan's own setting is chosen and in force,
        // nothing else measured.
        let knob = SplitKnob::Rows { start: 0.73 };
        let mut probe = Recorded::new(knob, r1_h200);
        probe.in_force = SplitSetting::Rows(0.5);
        let t = search_split_within(knob, &mut probe, Some(Duration::ZERO)).unwrap();
        assert_eq!(
            (t.chosen, probe.in_force, probe.probes),
            (knob.planned(), knob.planned(), 0)
        );
        // Without a limit the whole search runs.
        let mut probe = Recorded::new(knob, r1_h200);
        let t = search_split_within(knob, &mut probe, None).unwrap();
        assert!(probe.probes > 10);
        assert_whole(t.chosen, 0.05);
    }

    #[test]
    fn a_plan_with_ffn_down_whole_searches_up_and_gates_share_alone() {
        // The plan's mode is kept (its ffn_down no longer splits): the
        // climb walks up's and gate's share with ffn_down whole, from the
        // plan's least share, and probes nothing else.
        let knob = SplitKnob::RowsDownWhole { start: 0.025 };
        assert_eq!(knob.planned(), SplitSetting::RowsDownWhole(0.025));
        assert_eq!(knob.setting(-1), None, "below the least share");
        assert_eq!(knob.setting(WHOLE_BASE + 2), None);
        assert_whole(knob.setting(4).unwrap(), 0.125);
        // R1 Q4_K_M at 2 GiB on an H200 host (call 2026-11-29-d): fastest
        // at 5% of up and gate with ffn_down whole.
        let ms = |x: SplitSetting| match x {
            SplitSetting::RowsDownWhole(s) => 32.0 + 40.0 * (s - 0.05).abs(),
            other => panic!("{other}"),
        };
        let mut search = ShareSearch::new(knob);
        let order = run(&mut search, ms);
        assert!(order.len() <= 6, "{order:?}");
        assert_whole(search.best(), 0.05);
        let mut probe = Recorded::new(knob, ms);
        let t = search_split(knob, &mut probe).unwrap();
        assert_eq!(
            (t.planned, t.chosen, probe.in_force),
            (knob.planned(), search.best(), search.best())
        );
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }
}
