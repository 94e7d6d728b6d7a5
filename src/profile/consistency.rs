//! Consistency of a profile's expert samples across the experts used.
//!
//! A sample is the minimum over its reps, which removes a short stall but
//! not a host that was slow through all of one sample's reps (the H200
//! host measured q4_K's 4 of 128 experts at 10.1 ms and its 8 at 0.15 ms).
//! The samples of one weight and batch at other expert counts show such an
//! outlier; this module finds and repairs them.

use super::{Device, MatmulSample};

/// How much faster than the experts used a sample's time may grow before
/// it counts as an outlier: twice proportional. The op's fixed cost makes
/// real growth slower than proportional; the slack is for noise.
const GROWTH_SLACK: f64 = 2.0;

/// The seconds of one group's samples (the same device, type, weight and
/// batch; `(experts used, seconds)` each), made consistent.
///
/// The rule, for used counts `a < b`: `t(a) <= t(b)` (more experts never
/// take less time) and `t(b) <= t(a) * (b / a) * GROWTH_SLACK`. A group
/// that keeps it comes back unchanged. A slowed host only makes a sample
/// slower, so where two samples break the rule the slower one is the
/// outlier, and the repair lowers each sample of the group to the largest
/// time the others allow with no slack: `t(a) <= t(b)` and
/// `t(b) <= t(a) * b / a` (growth at most proportional, a fixed cost of
/// at least zero, as [`super::MachineProfile::expert_seconds`] fits it).
/// That is conservative: never below what the faster samples support.
pub fn consistent_expert_seconds(group: &[(i64, f64)]) -> Vec<f64> {
    let checked = bounded(group, GROWTH_SLACK);
    if checked.iter().zip(group).all(|(&t, s)| t >= s.1) {
        return checked;
    }
    bounded(group, 1.0)
}

/// Each of `group`'s seconds lowered to the least bound the others put on
/// it, growth allowed up to `slack` times proportional. One pass suffices:
/// a bound through a third sample is never tighter than the direct one.
fn bounded(group: &[(i64, f64)], slack: f64) -> Vec<f64> {
    let bound = |ui: i64, (uj, tj): (i64, f64)| {
        if uj >= ui {
            tj
        } else {
            tj * ui as f64 / uj.max(1) as f64 * slack
        }
    };
    group
        .iter()
        .map(|&(u, t)| group.iter().fold(t, |t, &o| t.min(bound(u, o))))
        .collect()
}

/// What one group of expert samples shares: everything but the experts used.
type GroupKey<'a> = (Device, &'a str, i64, i64, i64, i64, bool);

fn group_key(s: &MatmulSample) -> Option<GroupKey<'_>> {
    let (n_expert, _) = s.experts?;
    Some((s.device, &s.ty, s.k, s.n, s.tokens, n_expert, s.link_busy))
}

/// The indices into `samples` of each group of expert samples, and what
/// the rule makes of each group's seconds.
fn groups(samples: &[MatmulSample]) -> Vec<(Vec<usize>, Vec<f64>)> {
    let mut by_key: Vec<(GroupKey<'_>, Vec<usize>)> = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        let Some(key) = group_key(s) else { continue };
        match by_key.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => by_key.push((key, vec![i])),
        }
    }
    by_key
        .into_iter()
        .map(|(_, members)| {
            let group: Vec<(i64, f64)> = members
                .iter()
                .map(|&i| (samples[i].experts.map_or(1, |e| e.1), samples[i].seconds))
                .collect();
            (members, consistent_expert_seconds(&group))
        })
        .collect()
}

/// The indices of the expert samples in groups that break the rule (each
/// such group's samples, all of them: worth measuring again).
pub fn inconsistent(samples: &[MatmulSample]) -> Vec<usize> {
    groups(samples)
        .into_iter()
        .filter(|(members, fixed)| members.iter().zip(fixed).any(|(&i, &t)| t < samples[i].seconds))
        .flat_map(|(members, _)| members)
        .collect()
}

/// Repairs the expert samples that break the rule
/// ([`consistent_expert_seconds`]), with a warning naming each.
pub fn repair(samples: &mut [MatmulSample]) {
    for (members, fixed) in groups(samples) {
        for (i, t) in members.into_iter().zip(fixed) {
            let s = &mut samples[i];
            if t < s.seconds {
                let (n_expert, used) = s.experts.unwrap_or((1, 1));
                tracing::warn!(
                    "profile: {:?} {} {}x{} expert sample, {used} of {n_expert} experts, batch of {}: \
                     {:.1} us is inconsistent with its other expert counts (a host slowed while measuring); \
                     priced at {:.1} us",
                    s.device,
                    s.ty,
                    s.k,
                    s.n,
                    s.tokens,
                    s.seconds * 1e6,
                    t * 1e6
                );
                s.seconds = t;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(group: &[(i64, f64)]) -> Vec<f64> {
        let secs: Vec<(i64, f64)> = group.iter().map(|&(u, t)| (u, t * 1e-6)).collect();
        consistent_expert_seconds(&secs)
            .into_iter()
            .map(|t| (t * 1e7).round() / 10.0)
            .collect()
    }

    #[test]
    fn a_sample_slower_than_more_experts_is_lowered_to_theirs() {
        // The H200 host's q4_K, 4 and 8 of 128 experts, one token.
        assert_eq!(us(&[(4, 10100.8), (8, 150.5)]), vec![150.5, 150.5]);
        assert_eq!(us(&[(8, 150.5), (4, 10100.8)]), vec![150.5, 150.5]);
    }

    #[test]
    fn a_sample_growing_past_twice_proportional_is_lowered_to_proportional() {
        // The H200 host's q6_K: 2964.5 us for 8 experts against 93.0 us for 4.
        assert_eq!(us(&[(4, 93.0), (8, 2964.5)]), vec![93.0, 186.0]);
    }

    #[test]
    fn consistent_groups_stay_as_measured() {
        for group in [
            vec![(4, 75.6), (8, 136.7)],  // q4_0
            vec![(4, 84.1), (8, 148.5)],  // mxfp4
            vec![(4, 12.6), (8, 15.7)],   // a GPU's fixed cost
            vec![(4, 100.0), (8, 400.0)], // exactly twice proportional
            vec![(4, 100.0), (8, 100.0)], // flat
            vec![(8, 1645.8)],            // one count alone
            vec![(2, 30.0), (4, 55.0), (8, 110.0)],
        ] {
            let want: Vec<f64> = group.iter().map(|g| g.1).collect();
            assert_eq!(us(&group), want, "{group:?}");
        }
    }

    #[test]
    fn a_repaired_group_keeps_the_rule() {
        let fixed = us(&[(2, 30.0), (4, 5000.0), (8, 20.0)]);
        assert_eq!(fixed, vec![20.0, 20.0, 20.0]);
        let fixed = us(&[(2, 30.0), (4, 40.0), (8, 9000.0)]);
        assert_eq!(fixed, vec![30.0, 40.0, 80.0]);
    }

    fn sample(ty: &str, tokens: i64, used: i64, seconds_us: f64) -> MatmulSample {
        MatmulSample {
            device: Device::Cpu,
            ty: ty.into(),
            k: 2048,
            n: 768,
            tokens,
            experts: Some((128, used)),
            link_busy: false,
            seconds: seconds_us * 1e-6,
        }
    }

    #[test]
    fn only_the_outliers_groups_are_measured_again_and_repaired() {
        let mut samples = vec![
            sample("q4_0", 1, 4, 75.6),
            sample("q4_0", 1, 8, 136.7),
            sample("q4_K", 1, 4, 10100.8),
            sample("q4_K", 1, 8, 150.5),
            sample("q4_K", 16, 8, 4997.3),
            sample("q6_K", 1, 4, 93.0),
            sample("q6_K", 1, 8, 2964.5),
        ];
        assert_eq!(inconsistent(&samples), vec![2, 3, 5, 6]);
        let before = samples.clone();
        repair(&mut samples);
        let changed: Vec<(usize, f64)> = (0..samples.len())
            .filter(|&i| samples[i] != before[i])
            .map(|i| (i, (samples[i].seconds * 1e7).round() / 10.0))
            .collect();
        assert_eq!(changed, vec![(2, 150.5), (6, 186.0)]);
        assert!(inconsistent(&samples).is_empty());
    }
}
