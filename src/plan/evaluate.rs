//! Fast, exact evaluation of a placement: op times are computed once per
//! configuration (ubatch size, KV layers) and a placement is then priced by
//! table look-ups, so the optimizer can compare thousands of placements.

use super::cost::{is_host_only, is_placeable, CostModel, Exec, HybridParts, SplitParts, Streaming};
use super::expert_cache::decode_room;
use super::expert_cache::{positions, ExpertCachePlan, Locality};
use super::row_split::DOWN_WHOLE_LEAST_SHARE;
use super::PlanRequest;
use super::{tier_index, Plan, Prediction, RowSplit, SpeculationPrediction, Workload};
use crate::gguf::{ModelInfo, ModelTensor, TensorRole};

/// Device buffers are aligned to this (ggml-cuda's buffer alignment).
pub const SLOT_ALIGN: u64 = 128;

/// Op times of every placeable tensor for one configuration.
pub struct Evaluator {
    /// Placeable tensor indices into `ModelInfo::tensors`, in graph order.
    pub tensors: Vec<usize>,
    layer: Vec<Option<u32>>,
    is_qkv: Vec<bool>,
    /// Distinct ubatch sizes and how often each runs: the prompt's full
    /// chunks and its last partial chunk, then decode (one token of each
    /// sequence decoding together), a lone sequence's single-token decode
    /// when several decode together, then speculative verification if the
    /// workload has it.
    sizes: Vec<(u64, f64)>,
    /// Index into `sizes` of decode; the ones before it are prompt chunks.
    decode: usize,
    /// Index into `sizes` of single-token decode (`decode` itself when one
    /// sequence decodes): the only size whose experts and rows split
    /// between the CPU and the GPU (patches 0006 and 0017 split
    /// single-token ubatches only).
    single: usize,
    /// Index into `sizes` of speculative verification batches.
    verify: Option<usize>,
    /// Token tiers, ascending.
    tiers: Vec<u32>,
    /// Per size, per tensor: (resident seconds, best host exec, its seconds,
    /// link seconds of a pipelined copy, priced per ubatch). A hybrid
    /// layer's expert tensors each carry a third of the layer's time.
    times: Vec<Vec<(f64, Exec, f64, f64)>>,
    /// Per size, per tensor of a hybrid layer: its best exec, seconds and
    /// link seconds when the layer cannot split (one of its expert tensors
    /// is resident).
    unsplit: Vec<Vec<Option<(Exec, f64, f64)>>>,
    /// Per tensor: the other routed-expert tensors of its layer.
    siblings: Vec<Vec<usize>>,
    /// How many of each token's routed experts hybrid layers run on the
    /// GPU in single-token decode (0: none is hybrid).
    hybrid_k: u32,
    /// The hybrid layers of single-token decode: their expert tensors, and
    /// their parts for each share the GPU may take.
    hybrid: Vec<HybridLayer>,
    /// How many of each token's routed experts the hybrid layers of the
    /// decode ubatch of several sequences run on the GPU (0: none is
    /// hybrid there).
    batch_k: u32,
    /// The expert cache in single-token decode, where it is priced.
    cache: Option<CachePricing>,
    /// Per tensor: its row split's parts in single-token decode (patch
    /// 0017), where it may split when in host memory.
    split: Vec<Option<SplitParts>>,
    /// Per tensor: its seconds and pipelined link seconds in single-token
    /// decode where it streams whole there with ffn_down whole
    /// ([`RowSplit::down_whole`]): a split candidate ffn_down, and an
    /// attention weight the CPU would compute in a layer whose KV cache is
    /// on the GPU (as [`super::set_row_split`] puts the mode in force).
    whole: Vec<Option<(f64, f64)>>,
    /// A GPU share of the rows asked for, or None to choose it.
    split_forced: Option<f64>,
    /// Whether decode may stream ffn_down whole ([`CostModel::split_down_whole`]).
    split_down_whole: bool,
    /// The CPU's speed beside the link's copies, relative to alone (see
    /// [`CostModel::cpu_rate_beside_copies`]), from the split weights.
    cpu_rate_beside_copies: f64,
    /// Host memory's seconds per second of CPU work and of copies (see
    /// [`CostModel::host_memory_shares`]), from the split weights.
    host_memory: Option<(f64, f64)>,
    /// Per size: attention seconds summed over all chunks of that size.
    attention: Vec<f64>,
    /// Per size: of those, the seconds host KV cells are copied over the
    /// link (which streamed weights share).
    attention_link: Vec<f64>,
    kv_gpu_from: u32,
    switch_s: f64,
    /// Seconds per ubatch for the small ops of every layer (and the
    /// recurrent layers' mixers, see `Overheads::recurrent_layer_s`).
    layers_s: f64,
    /// The first prompt ubatch's attention masks, filled on the host before
    /// its graph starts (see `Overheads::mask_entry_s`).
    first_mask_s: f64,
    /// Seconds between two prompt ubatches (see `Overheads::ubatch_s`).
    ubatch_s: f64,
    /// Per tensor: its device bytes.
    vram: Vec<u64>,
    /// Per tensor: it goes through the streaming slots in some tier when
    /// in host memory (see [`Evaluator::streams`]).
    streams: Vec<bool>,
    /// Per tensor: it stays in host memory whatever the budget (see
    /// `Evaluator::new`, the routers of a plan whose slots decode together).
    host_only: Vec<bool>,
    /// Per tensor: it has a bias (gpt-oss, GLM). The bias stays with its
    /// layer, on the GPU from `kv_gpu_from` (llama.cpp's offloaded layers)
    /// and in host memory before, and llama.cpp's scheduler runs the add
    /// where the bias is: a weight computed on the other side crosses to it
    /// and back.
    biased: Vec<bool>,
    pub workload: Workload,
    pub ubatch: u32,
}

impl Evaluator {
    /// Precompute op times for ubatch `u` with the KV cache of the last
    /// `kv_layers` layers on the GPU.
    pub fn new(model: &ModelInfo, cm: &CostModel<'_>, workload: Workload, u: u32, kv_layers: u32) -> Evaluator {
        let tensors: Vec<usize> = (0..model.tensors.len())
            .filter(|&i| is_placeable(&model.tensors[i]))
            .collect();
        let p = workload.prompt_tokens;
        let u64_ = u as u64;
        let full = p / u64_;
        let rest = p % u64_;
        // (ubatch size, how many times it runs). Decode weighs gen_tokens;
        // with speculation every step is a verification batch instead.
        let mut sizes: Vec<(u64, f64)> = Vec::new();
        if full > 0 {
            sizes.push((u64_, full as f64));
        }
        if rest > 0 {
            sizes.push((rest, 1.0));
        }
        let spec = workload.speculation;
        // Sequences decoding together: each decode ubatch holds one token of
        // each, and the objective counts one sequence's share of the steps
        // (its prompt and gen_tokens / par steps: the workload of all of
        // them, divided by their number).
        let par = workload.decode_tokens() as u64;
        let decode = sizes.len();
        sizes.push((
            par,
            if spec.is_some() {
                0.0
            } else {
                workload.gen_tokens as f64 / par as f64
            },
        ));
        // A sequence decoding alone (the last one left, or the only one
        // there is for a while) keeps a tier of its own, priced but not
        // counted.
        let single = if par > 1 {
            sizes.push((1, 0.0));
            sizes.len() - 1
        } else {
            decode
        };
        let verify = spec.map(|s| {
            sizes.push((
                s.verify_tokens() as u64 * par,
                workload.gen_tokens as f64 / s.tokens_per_step() / par as f64,
            ));
            sizes.len() - 1
        });
        let mut tiers: Vec<u32> = vec![1, par as u32, u];
        tiers.extend(spec.map(|s| s.verify_tokens() * par as u32));
        tiers.sort_unstable();
        tiers.dedup();
        let kv_gpu_from = model.n_layer - kv_layers;
        // A ubatch runs with the decisions of the first tier at or above its
        // size, so a partial chunk reuses a bigger tier's.
        //
        // The decode tier of several sequences streams every host weight to
        // the GPU, as the prompt's tier does: on the H200 every variant that
        // ran part of a 4-token decode ubatch on the CPU was slower (experts
        // split between the CPU and the GPU: 39 tok/s in total for R2's
        // four clients, experts on the CPU: 33-36, the router and K/V
        // projections on the CPU: 33, against 57-61 with every weight
        // streamed; CHANGELOG.md, session 8): their CPU parts run
        // between the GPU's ops for several tokens, not beside them.
        let execs_by_tier: Vec<Vec<Exec>> = tiers
            .iter()
            .map(|&tier| {
                tensors
                    .iter()
                    .map(|&i| {
                        let t = &model.tensors[i];
                        // Its own tier, with the prompt tier's decisions.
                        let n = if par > 1 && tier as u64 == par { u } else { tier };
                        cm.best_host_exec(t, n as u64).0
                    })
                    .collect()
            })
            .collect();
        let mut times: Vec<Vec<(f64, Exec, f64, f64)>> = sizes
            .iter()
            .enumerate()
            .map(|(si, &(n, _))| {
                let execs = &execs_by_tier[tier_index(&tiers, n)];
                // A decode step needs the logits of every sequence's token;
                // the prompt only those of its last token, in its last
                // chunk: the other chunks compute no output rows (and wait
                // for none, patch 0030). `last` is the share of this size's
                // chunks that hold the prompt's last token.
                let (outputs, last) = if si == decode {
                    (n, 1.0)
                } else if si > decode {
                    (1, 1.0)
                } else if si + 1 == decode {
                    (1, 1.0 / sizes[si].1.max(1.0))
                } else {
                    (1, 0.0)
                };
                let per_chunk = |t: &ModelTensor, e: Exec| {
                    let with = cm.op_seconds_out(t, n, e, outputs);
                    if last >= 1.0 || t.role != TensorRole::Output {
                        return with;
                    }
                    last * with + (1.0 - last) * cm.op_seconds_out(t, n, e, 0)
                };
                tensors
                    .iter()
                    .enumerate()
                    .map(|(k, &i)| {
                        let t = &model.tensors[i];
                        let e = execs[k];
                        let link =
                            if e == Exec::Stream && cm.streaming == Streaming::Pipelined && !cm.streams_routed(t, n) {
                                cm.copy_seconds(t, n)
                            } else {
                                0.0
                            };
                        (per_chunk(t, Exec::Resident), e, per_chunk(t, e), link)
                    })
                    .collect()
            })
            .collect();
        // Hybrid experts: a layer whose routed-expert tensors (gate, up and
        // down) are all in host memory may split each token's experts
        // between the GPU and the CPU where that beats their best execs.
        let mut siblings = vec![Vec::new(); tensors.len()];
        let mut unsplit = vec![vec![None; tensors.len()]; sizes.len()];
        let mut hybrid_k = 0;
        let mut hybrid = Vec::new();
        let mut groups = Vec::new();
        for l in 0..model.n_layer {
            let group: Vec<usize> = (0..tensors.len())
                .filter(|&k| {
                    let t = &model.tensors[tensors[k]];
                    t.layer == Some(l) && t.holds_routed_experts()
                })
                .collect();
            if group.len() != 3 {
                continue;
            }
            for &k in &group {
                siblings[k] = group.iter().copied().filter(|&j| j != k).collect();
            }
            groups.push(group.clone());
            let weights: Vec<_> = group.iter().map(|&k| &model.tensors[tensors[k]]).collect();
            // Only single-token decode splits: the plan has one GPU share.
            let si = single;
            let Some((gpu_experts, secs)) = cm.best_hybrid(&weights, 1) else {
                continue;
            };
            let shares: Vec<(u32, HybridParts)> = cm
                .hybrid_shares()
                .into_iter()
                .map(|k| (k, cm.hybrid_parts(&weights, 1, k)))
                .collect();
            // A share asked for is used wherever the split applies. Else the
            // split must beat the layer's host execs at the hits the expert
            // cache gives once it holds a token's experts (the previous
            // token's reuse), where decode caches experts: without them a
            // split that copies every expert the GPU computes lost to the
            // CPU in every layer of R4 on the H200, where the cache made it
            // the faster one (`price_cache` prices the hits the room gives).
            let host: f64 = group.iter().map(|&k| times[si][k].2.max(times[si][k].3)).sum();
            let least_hits = cm.cache_locality.map_or(0.0, |l| l.reuse);
            let cached = shares
                .iter()
                .map(|(_, p)| p.seconds(least_hits))
                .fold(f64::INFINITY, f64::min);
            if cached >= host && cm.hybrid_gpu_experts.is_none() {
                continue;
            }
            hybrid_k = gpu_experts;
            for &k in &group {
                let (r, e, h, link) = times[si][k];
                unsplit[si][k] = Some((e, h, link));
                times[si][k] = (r, Exec::Hybrid, secs / group.len() as f64, 0.0);
            }
            hybrid.push(HybridLayer { group, shares });
        }
        let batch_k = if decode == single {
            0
        } else {
            batch_hybrid(model, cm, &tensors, &groups, decode, par, &mut times, &mut unsplit)
        };
        // Dense row split: in single-token decode a host feed-forward weight
        // may give a share of its rows to the GPU, which streams them while
        // the CPU computes the others. The share is one for the whole step,
        // chosen per residency (see `split_step`).
        let split: Vec<Option<SplitParts>> = tensors
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                let t = &model.tensors[i];
                (cm.splits_rows(t) && times[single][k].1 != Exec::Hybrid).then(|| cm.split_parts(t, 1))
            })
            .collect();
        let whole = tensors
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                let t = &model.tensors[i];
                let down = split[k].is_some() && t.role == TensorRole::FfnDown;
                let attention = times[single][k].1 == Exec::Cpu
                    && super::row_split::streams_with_down(&format!("{:?}", t.role), t.layer, kv_gpu_from);
                (down || attention).then(|| {
                    let link = if cm.streaming == Streaming::Pipelined {
                        cm.copy_seconds(t, 1)
                    } else {
                        0.0
                    };
                    (cm.op_seconds(t, 1, Exec::Stream), link)
                })
            })
            .collect();
        // Attention: prompt chunks at increasing depth, decode and
        // verification at the middle of the generated tokens. Sequences
        // sharing one KV stream pass over each other's cells too: a decode
        // token over every other sequence's, a prompt over those of the
        // prompts before it (half of the others', on average).
        let others = if cm.kv_unified { par - 1 } else { 0 };
        let (attention, attention_link): (Vec<f64>, Vec<f64>) = sizes
            .iter()
            .enumerate()
            .map(|(si, &(n, _))| {
                let (depths, masked): (Vec<u64>, u64) = if si >= decode {
                    let d = p + workload.gen_tokens / 2;
                    (vec![d], others * d)
                } else if n == u64_ {
                    ((0..full).map(|c| c * u64_).collect(), others * p / 2)
                } else {
                    (vec![full * u64_], others * p / 2)
                };
                depths
                    .iter()
                    .flat_map(|&d| (0..model.n_layer).map(move |l| (l, d)))
                    .map(|(l, d)| cm.attention_shared(l, n, d + n / 2, masked, l >= kv_gpu_from))
                    .fold((0.0, 0.0), |(s, k), (a, c)| (s + a, k + c))
            })
            .unzip();
        // One mask per kind of attention (full, sliding window), of the
        // first ubatch's tokens x the cells it sees (padded to 256).
        let first = if full > 0 { u64_ } else { rest };
        let swa = (0..model.n_layer).filter(|&l| model.is_swa(l)).count() as u32;
        let masks = u64::from(swa > 0) + u64::from(swa < model.n_layer);
        let first_mask_s = (masks * first * first.div_ceil(256) * 256) as f64 * cm.overheads.mask_entry_s;
        let all_parts = split.iter().flatten().fold(SplitParts::default(), |mut a, &p| {
            a += p;
            a
        });
        let cpu_rate_beside_copies = cm.cpu_rate_beside_copies(&all_parts);
        let host_memory = cm.host_memory_shares(&all_parts);
        // Where several sequences decode together and their ubatch copies
        // only the routed experts, each layer's router stays in host memory
        // and streams: on the H200, R2's 4-token step with the routers
        // resident took 88 ms and copied twice the bytes (the expert copies
        // evidently no longer all routed), against 42-45 ms with them
        // streamed, the plan otherwise the same (CHANGELOG.md, session 11).
        let routers_stream = par > 1 && cm.routed_max_tokens >= par;
        let biases: std::collections::HashSet<&str> = model
            .tensors
            .iter()
            .filter(|t| t.is_bias())
            .map(|t| t.name.as_str())
            .collect();
        let biased = tensors
            .iter()
            .map(|&i| {
                let stem = model.tensors[i].name.strip_suffix(".weight");
                stem.is_some_and(|s| biases.contains(format!("{s}.bias").as_str()))
            })
            .collect();
        let host_only = tensors
            .iter()
            .map(|&i| {
                let t = &model.tensors[i];
                (routers_stream && t.role == TensorRole::MoeRouter) || is_host_only(t)
            })
            .collect();
        let streams = (0..tensors.len())
            .map(|k| {
                (0..times.len()).any(|si| {
                    matches!(times[si][k].1, Exec::Stream | Exec::Hybrid)
                        || unsplit[si][k].is_some_and(|u| u.0 == Exec::Stream)
                }) || split[k].is_some()
            })
            .collect();
        Evaluator {
            streams,
            layer: tensors.iter().map(|&i| model.tensors[i].layer).collect(),
            vram: tensors.iter().map(|&i| model.tensors[i].cuda_alloc_size()).collect(),
            is_qkv: tensors
                .iter()
                .map(|&i| {
                    matches!(
                        model.tensors[i].role,
                        TensorRole::AttnQ | TensorRole::AttnK | TensorRole::AttnV | TensorRole::AttnQkv
                    )
                })
                .collect(),
            tensors,
            sizes,
            decode,
            single,
            verify,
            tiers,
            times,
            unsplit,
            siblings,
            hybrid_k,
            hybrid,
            batch_k,
            cache: None,
            split,
            whole,
            split_forced: cm.dense_split.filter(|&f| f > 0.0).map(|f| f.min(1.0)),
            split_down_whole: cm.split_down_whole,
            cpu_rate_beside_copies,
            host_memory,
            attention,
            attention_link,
            kv_gpu_from,
            switch_s: cm.overheads.device_switch_s,
            layers_s: model.n_layer as f64 * cm.overheads.layer_s
                + (0..model.n_layer).filter(|&l| model.is_recurrent(l)).count() as f64 * cm.overheads.recurrent_layer_s,
            first_mask_s,
            ubatch_s: cm.overheads.ubatch_s,
            host_only,
            biased,
            workload,
            ubatch: u,
        }
    }

    /// Price the expert cache of single-token decode (patch 0040) with
    /// `cm`'s locality, in `compute_room` bytes of compute buffers that the
    /// decode graph leaves unused and the plan's `slots` streaming slots;
    /// no cache without a locality.
    pub fn price_cache(&mut self, model: &ModelInfo, cm: &CostModel<'_>, compute_room: u64, slots: u32) {
        self.cache = cm.cache_locality.map(|locality| {
            let n_expert = model.n_expert.max(1);
            let per_expert = |t: &ModelTensor| {
                if t.holds_routed_experts() {
                    t.nbytes / u64::from(n_expert)
                } else {
                    0
                }
            };
            let routed_copy = |t: &ModelTensor| {
                if t.holds_routed_experts() && cm.streams_routed(t, 1) {
                    cm.copy_seconds(t, 1) - cm.overheads.stream_issue_s
                } else {
                    0.0
                }
            };
            CachePricing {
                locality,
                compute_room,
                slots,
                expert_bytes: self.tensors.iter().map(|&i| per_expert(&model.tensors[i])).collect(),
                routed_copy: self.tensors.iter().map(|&i| routed_copy(&model.tensors[i])).collect(),
                n_expert,
                n_used: model.n_expert_used,
            }
        });
    }

    /// The expert cache of single-token decode under `resident`, where it
    /// is priced and used.
    pub fn expert_cache(&self, resident: &[bool]) -> Option<ExpertCachePlan> {
        self.cache_step(resident).and_then(|c| c.plan)
    }

    /// Per tensor (an index into `self.tensors`): its device bytes.
    pub fn device_bytes(&self) -> &[u64] {
        &self.vram
    }

    /// Device bytes of `slots` streaming slots under `resident`: each holds
    /// the largest weight that goes through them.
    pub fn slot_bytes(&self, resident: &[bool], slots: u32) -> u64 {
        let largest = (0..self.vram.len())
            .filter(|&k| !resident[k] && self.streams(k))
            .map(|k| self.vram[k].div_ceil(SLOT_ALIGN) * SLOT_ALIGN)
            .max()
            .unwrap_or(0);
        largest * u64::from(slots)
    }

    /// The expert cache in single-token decode under `resident`: every
    /// routed split's weight (the hybrid layers' experts, experts streamed
    /// by their routed copies) gets as many positions as the room holds,
    /// and the hybrid layers' GPU share is the best at the hits that gives.
    /// None where no split is cached, or where a split streams a whole
    /// weight through the slots (the scheduler caches no split then).
    fn cache_step(&self, resident: &[bool]) -> Option<CacheStep> {
        let c = self.cache.as_ref()?;
        let si = self.single;
        let (mut per_position, mut weights) = (0u64, 0u32);
        let mut routed = 0.0;
        for k in 0..resident.len() {
            if resident[k] || self.host_only[k] {
                continue;
            }
            match self.host_time(k, si, resident).0 {
                Exec::Hybrid => {
                    per_position += c.expert_bytes[k];
                    weights += 1;
                }
                Exec::Stream if c.routed_copy[k] > 0.0 => {
                    per_position += c.expert_bytes[k];
                    weights += 1;
                    routed += c.routed_copy[k];
                }
                Exec::Stream => return None,
                _ if self.split[k].is_some() => return None,
                _ => {}
            }
        }
        if per_position == 0 {
            return None;
        }
        let room = c.compute_room + self.slot_bytes(resident, c.slots);
        let n_pos = positions(room, per_position, c.n_expert);
        let layers: Vec<&HybridLayer> = self
            .hybrid
            .iter()
            .filter(|l| l.group.iter().all(|&k| !resident[k]))
            .collect();
        let uncached: f64 = layers
            .iter()
            .flat_map(|l| l.group.iter().map(|&k| self.times[si][k].2))
            .sum::<f64>()
            + routed;
        // The scheduler caches no split if one routes more experts than the
        // positions hold.
        let streamed_need = if routed > 0.0 { c.n_used } else { 0 };
        let hits = |need: u32| {
            if n_pos < u64::from(need.max(streamed_need)) {
                0.0
            } else {
                c.locality.cache_hits(n_pos, need, c.n_expert, c.n_used)
            }
        };
        let routed_cached = (1.0 - hits(streamed_need)) * routed;
        let shares: Vec<u32> = layers
            .first()
            .map_or_else(Vec::new, |l| l.shares.iter().map(|s| s.0).collect());
        let (hybrid_k, cached) = shares
            .iter()
            .enumerate()
            .map(|(i, &k)| {
                let h = hits(k);
                (k, layers.iter().map(|l| l.shares[i].1.seconds(h)).sum::<f64>())
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((self.hybrid_k, 0.0));
        let need = if layers.is_empty() { streamed_need } else { hybrid_k };
        Some(CacheStep {
            saved: (uncached - cached - routed_cached).max(0.0),
            hybrid_k,
            plan: (n_pos >= u64::from(need.max(streamed_need))).then_some(ExpertCachePlan {
                positions: n_pos as u32,
                weights,
                bytes: n_pos * per_position,
                hits: hits(need),
                locality: c.locality,
            }),
        })
    }

    /// The host exec of tensor `k` at size index `si`, its seconds and
    /// pipelined link seconds, given which tensors are resident: a hybrid
    /// layer only splits when all its expert tensors are in host memory.
    fn host_time(&self, k: usize, si: usize, resident: &[bool]) -> (Exec, f64, f64) {
        let (_, e, h, l) = self.times[si][k];
        match self.unsplit[si][k] {
            Some(alone) if self.siblings[k].iter().any(|&j| resident[j]) => alone,
            _ => (e, h, l),
        }
    }

    /// How the op of placeable tensor `k` (an index into `self.tensors`) runs at size index `si`;
    /// `split_share` is [`Evaluator::decode_split_share`] of `resident`, which the caller works
    /// out once for all tensors.
    pub fn exec(&self, k: usize, si: usize, resident: &[bool], split_share: f64) -> Exec {
        if resident[k] {
            Exec::Resident
        } else if si == self.single && self.split[k].is_some() && split_share > 0.0 {
            Exec::Split
        } else {
            self.host_time(k, si, resident).0
        }
    }

    /// The row split of decode under `resident`: the GPU's share of each
    /// split weight's rows (0 if no weight splits) and its mode.
    pub fn decode_row_split(&self, resident: &[bool]) -> RowSplit {
        self.decode_step(self.single, resident).0
    }

    /// One ubatch of size index `si` past the prompt under `resident`: its
    /// row split and seconds. Single-token decode takes the faster of the
    /// row split's two modes ([`RowSplit`]): every split weight at one
    /// share, or ffn_down streamed whole with up and gate split (not where
    /// the share is forced, nor where the cost model leaves the mode out).
    fn decode_step(&self, si: usize, resident: &[bool]) -> (RowSplit, f64) {
        let every = self.split_mode(si, resident, false);
        let downs = (0..resident.len()).any(|k| !resident[k] && self.split[k].is_some() && self.whole[k].is_some());
        if si != self.single || !downs || self.split_forced.is_some() || !self.split_down_whole {
            return every;
        }
        let whole = self.split_mode(si, resident, true);
        if whole.0.down_whole && whole.1 < every.1 {
            whole
        } else {
            every
        }
    }

    /// [`Evaluator::decode_step`] in one mode. With ffn_down whole, up and
    /// gate on the CPU but for the least share the decode tuner walks
    /// ([`DOWN_WHOLE_LEAST_SHARE`]) is priced as unsplit: their CPU part
    /// beside the link's copies of ffn_down, as every host weight the CPU
    /// computes beside streamed ones is priced. The split's term for the
    /// CPU slowed by the copies (calibrated on Q4_0's every-weight split,
    /// see `split_step`) prices that step far slower than measured: R1
    /// Q4_K_M at 2 GiB on an H200 host took 39.0-39.5 ms per step with 2.5%
    /// of up's and gate's rows on the GPU and ffn_down whole, against
    /// 40.1-40.7 at the fastest share of every weight split (43%), and the
    /// tuner chose ffn_down whole with 2.5-7.5% in all six R1 runs of that
    /// call, Q4_0 and Q4_K_M (bench/results/raw/2026-11-29-d), where the
    /// split's term priced 2.5% 13% slower than 43%.
    fn split_mode(&self, si: usize, resident: &[bool], down_whole: bool) -> (RowSplit, f64) {
        let (compute, link, sums) = self.weights_seconds(si, resident, down_whole);
        let (share, secs) = self.split_step(
            compute + self.attention[si],
            link + self.attention_link[si],
            &sums,
            down_whole,
        );
        // Unsplit, up and gate run where they run alone: on the CPU, where
        // none of them streams. Their reads and the link's copies of
        // ffn_down share host memory: on the H200 host R1 Q4_K_M at 2 GiB
        // took 41.0-42.5 ms per step with ffn_down whole and 5-10% of up
        // and gate on the GPU, its CPU splits 27.5 ms of it (call
        // 2026-11-29-j, tR1k), where the longer of the CPU's work and the
        // link's alone priced 33.5 ms (29.8 tok/s, 23.9 measured); host
        // memory serving both at `host_read_bw_with_link` prices 41.0 (24.4
        // tok/s). Q4_0 at 2.5%: 26.9 tok/s, 27.0 measured (tR1).
        let on_cpu = sums.n > 0 && sums.alone.1 == 0.0;
        let secs = match self.host_memory {
            Some((a, b)) if down_whole && share == 0.0 && on_cpu => {
                let cpu = sums.alone.0 + sums.cpu_other;
                let copies = link + self.attention_link[si];
                secs.max(cpu * a + copies * b)
            }
            _ => secs,
        };
        let share = if down_whole && share == 0.0 && on_cpu {
            DOWN_WHOLE_LEAST_SHARE
        } else {
            share
        };
        let down_whole = down_whole && share > 0.0;
        (RowSplit { share, down_whole }, secs)
    }

    /// One decode step whose other work takes `compute` seconds serially and
    /// `link` seconds of pipelined copies, with the row-split candidates of
    /// `sums` in host memory: the GPU share of their rows and the step's
    /// seconds. The CPU's rows add to the serial work (with a device switch
    /// per split weight: its product crosses to the GPU), the GPU's rows'
    /// copies to the link; the chosen share balances the two, and is 0
    /// where splitting does not beat each weight's own best exec.
    ///
    /// While the link copies, the CPU's ops run at `r` of their speed (host
    /// memory serves the copies first, see
    /// [`CostModel::cpu_rate_beside_copies`]) and the rest of the serial
    /// work (GPU ops, attention, switches) at full speed: with `S` seconds
    /// of serial work, `C` of them on the CPU, the serial work runs at
    /// `q = S / (C / r + S - C)` while the `L` seconds of copies run, and
    /// the step takes `max(L, S + (1 - q) L)`. Measured on the H200 host (R1
    /// at 2 GiB, CHANGELOG.md, session 9): 19.7 tok/s with 63% of the rows on
    /// the GPU, 21.5-22.3 with 70-75%, 19.1-19.6 with 78-80%. With ffn_down
    /// whole (`down_whole`) the CPU hands its part over once per layer, not
    /// once per split weight.
    fn split_step(&self, compute: f64, link: f64, sums: &SplitSums, down_whole: bool) -> (f64, f64) {
        let unsplit = (compute + sums.alone.0).max(link + sums.alone.1);
        if sums.n == 0 {
            return (0.0, unsplit);
        }
        let p = sums.parts;
        let r = self.cpu_rate_beside_copies;
        let handovers = if down_whole { sums.layers } else { sums.n };
        let switches = handovers as f64 * self.switch_s;
        let at = |f: f64| {
            let serial = compute + (1.0 - f) * p.cpu + f * p.gpu + switches;
            let on_cpu = (sums.cpu_other + (1.0 - f) * p.cpu).min(serial);
            let q = serial / (on_cpu / r + serial - on_cpu).max(1e-12);
            let copies = link + f * p.link;
            copies.max(serial + (1.0 - q) * copies)
        };
        if let Some(f) = self.split_forced {
            return (f, at(f));
        }
        // The step is the larger of a rising and a falling function of the
        // share: a fine grid finds the crossing.
        const STEPS: u32 = 200;
        let f = (1..=STEPS)
            .map(|i| i as f64 / STEPS as f64)
            .min_by(|a, b| at(*a).total_cmp(&at(*b)))
            .unwrap_or(0.0);
        let secs = at(f);
        if f > 0.0 && secs < unsplit {
            (f, secs)
        } else {
            (0.0, unsplit)
        }
    }

    /// Whether a non-resident tensor `k` goes through the streaming slots in
    /// some tier (streamed, or the GPU part of hybrid experts).
    pub fn streams(&self, k: usize) -> bool {
        self.streams[k]
    }

    /// How many of each token's routed experts hybrid layers run on the GPU
    /// in decode under `resident`; 0 if no layer is hybrid.
    pub fn hybrid_gpu_experts(&self, resident: &[bool]) -> u32 {
        let si = self.single;
        let share = self.decode_row_split(resident).share;
        let hybrid = (0..self.tensors.len()).any(|k| self.exec(k, si, resident, share) == Exec::Hybrid);
        if !hybrid {
            0
        } else {
            self.cache_step(resident).map_or(self.hybrid_k, |c| c.hybrid_k)
        }
    }

    /// How many of each token's routed experts hybrid layers run on the
    /// GPU in the decode ubatch of several sequences under `resident`; 0 if
    /// none is hybrid there (or one sequence decodes).
    pub fn batch_gpu_experts(&self, resident: &[bool]) -> u32 {
        let (si, share) = (self.decode, 0.0);
        let hybrid = self.decode != self.single
            && (0..self.tensors.len()).any(|k| self.exec(k, si, resident, share) == Exec::Hybrid);
        if hybrid {
            self.batch_k
        } else {
            0
        }
    }

    /// Seconds one ubatch of size index `si` takes under `resident`
    /// (excluding attention), with device switches and every layer's small
    /// ops; and the seconds its
    /// pipelined copies keep the link busy, which overlap all of that. With
    /// `down_whole`, single-token decode streams the weights of
    /// `self.whole` instead of splitting them or computing them on the CPU.
    fn weights_seconds(&self, si: usize, resident: &[bool], down_whole: bool) -> (f64, f64, SplitSums) {
        let mut total = 0.0;
        let mut link = 0.0;
        let mut sums = SplitSums::default();
        let mut switches = 0u32;
        let mut last: Option<bool> = None;
        let mut visit = |gpu: bool| {
            if last.is_some_and(|g| g != gpu) {
                switches += 1;
            }
            last = Some(gpu);
        };
        let mut current_layer: Option<u32> = None;
        let mut last_split_layer: Option<u32> = None;
        let mut attn_visited = true;
        for (k, &res) in resident.iter().enumerate() {
            let layer = self.layer[k];
            if layer != current_layer {
                if !attn_visited {
                    if let Some(l) = current_layer {
                        visit(l >= self.kv_gpu_from);
                    }
                }
                current_layer = layer;
                attn_visited = layer.is_none();
            }
            if !attn_visited && !self.is_qkv[k] {
                if let Some(l) = layer {
                    visit(l >= self.kv_gpu_from);
                }
                attn_visited = true;
            }
            let streams_whole = self.whole[k].filter(|_| down_whole && si == self.single);
            if res {
                total += self.times[si][k].0;
                visit(true);
            } else if let Some((h, l)) = streams_whole {
                total += h;
                link += l;
                visit(true);
            } else {
                let (e, h, l) = self.host_time(k, si, resident);
                match self.split[k] {
                    // Priced with the step's other work, see `split_step`.
                    Some(parts) if si == self.single => {
                        if layer != last_split_layer {
                            sums.layers += 1;
                            last_split_layer = layer;
                        }
                        sums.n += 1;
                        sums.parts += parts;
                        sums.alone.0 += h;
                        sums.alone.1 += l;
                    }
                    _ => {
                        total += h;
                        link += l;
                        if si == self.single && e == Exec::Cpu {
                            sums.cpu_other += h;
                        }
                    }
                }
                // The CPU part of hybrid experts comes between GPU work, like an op on the CPU.
                visit(!matches!(e, Exec::Cpu | Exec::Hybrid));
            }
            if let (true, Some(l)) = (self.biased[k], layer) {
                visit(l >= self.kv_gpu_from);
            }
        }
        if si == self.single {
            total -= self.cache_step(resident).map_or(0.0, |c| c.saved);
        }
        (total + switches as f64 * self.switch_s + self.layers_s, link, sums)
    }

    /// Predicted TTFT and decode speed for a residency vector over `self.tensors`.
    pub fn evaluate(&self, resident: &[bool]) -> Prediction {
        let chunks: f64 = self.sizes[..self.decode].iter().map(|&(_, count)| count).sum();
        let mut ttft = self.first_mask_s + (chunks - 1.0).max(0.0) * self.ubatch_s;
        for (si, &(_, count)) in self.sizes[..self.decode].iter().enumerate() {
            // All chunks of this size (attention is summed over them).
            // Only decode splits rows, so `sums` is empty here.
            let (compute, link, _) = self.weights_seconds(si, resident, false);
            ttft += (compute * count + self.attention[si]).max(link * count + self.attention_link[si]);
        }
        let (decode_tok_s, speculation) = self.decode_speed(resident);
        let p = self.workload.prompt_tokens as f64;
        Prediction {
            ttft_s: ttft,
            prompt_tok_s: p / ttft.max(1e-12),
            decode_tok_s,
            speculation,
        }
    }

    /// The decode speed of [`Evaluator::evaluate`] (tokens of every
    /// sequence decoding together, per second), and with speculative
    /// decoding what a step costs and yields.
    pub fn decode_speed(&self, resident: &[bool]) -> (f64, Option<SpeculationPrediction>) {
        // One ubatch of size index `si` past the prompt (attention is priced at one depth).
        let step = |si: usize| self.decode_step(si, resident).1;
        let par = self.workload.decode_tokens() as f64;
        let plain_decode_tok_s = par / step(self.decode).max(1e-12);
        let gen = self.workload.gen_tokens as f64;
        let mut decode_tok_s = plain_decode_tok_s;
        let speculation = self.workload.speculation.zip(self.verify).map(|(s, vi)| {
            let verify_s = step(vi);
            let step_s = verify_s + s.draft_tokens as f64 * s.draft_token_s;
            let tokens_per_step = s.tokens_per_step();
            // The draft reads the prompt once, then every step yields tokens.
            let per_token = (s.draft_prompt_s / gen.max(1.0) + step_s / tokens_per_step).max(1e-12);
            decode_tok_s = par / per_token;
            SpeculationPrediction {
                verify_s,
                step_s,
                tokens_per_step,
                plain_decode_tok_s,
            }
        });
        (decode_tok_s, speculation)
    }

    /// The optimizer's objective: seconds for the whole workload, per
    /// sequence where several decode together (their prompts one after the
    /// other, then their decode steps together).
    pub fn objective(&self, p: &Prediction) -> f64 {
        // `decode_tok_s` is theirs in total: gen_tokens / it is one
        // sequence's share of the steps.
        p.ttft_s + self.workload.gen_tokens as f64 / p.decode_tok_s.max(1e-12)
    }

    /// Seconds saved over the workload by making tensor `k` resident, ignoring
    /// device switches (used to order candidates).
    pub fn saving(&self, k: usize) -> f64 {
        if self.host_only[k] {
            return 0.0;
        }
        self.sizes
            .iter()
            .enumerate()
            .map(|(si, &(_, count))| {
                let (r, _, h, l) = self.times[si][k];
                count * (h.max(l) - r)
            })
            .sum()
    }

    /// Tiers of this configuration, ascending: single-token decode, decode
    /// of the sequences decoding together, the speculative verification
    /// batch if any, and the ubatch.
    pub fn tiers(&self) -> Vec<u32> {
        self.tiers.clone()
    }

    /// The exec of tensor `k` for a tier (`split_share` as for [`Evaluator::exec`]).
    pub fn tier_exec(&self, k: usize, tier: u32, resident: &[bool], split_share: f64) -> Exec {
        // Decode, a lone sequence's decode or verification; else the
        // prompt's chunks.
        let si = if tier == 1 {
            self.single
        } else {
            (self.decode..self.sizes.len())
                .find(|&si| self.sizes[si].0 == tier as u64)
                .unwrap_or(0)
        };
        self.exec(k, si, resident, split_share)
    }
}

/// A tensor's times at one size, as [`Evaluator`]'s `times` holds them.
type OpTimes = (f64, Exec, f64, f64);
/// A tensor's exec alone, its seconds and link seconds.
type HostExec = (Exec, f64, f64);

/// Hybrid experts in the decode ubatch of `par` sequences decoding
/// together (size index `decode`): each token's first `k` routed experts on
/// the GPU, which copies the union of the experts they route to over the
/// tokens, the others on the CPU beside it ([`CostModel::hybrid_parts`] at
/// `par` tokens; no cache hits, as the step routes more experts than the
/// cache holds). One share for every layer, the one that makes the step
/// fastest with each layer split only where that beats its execs there
/// (streaming every routed expert of the step); those layers' tensors run
/// [`Exec::Hybrid`] in `times`, their execs alone kept in `unsplit`. The
/// share, or 0 where no layer splits.
///
/// With the calibrated routing of `moe-routing.md` four sequences route to
/// nearly four times one token's experts: on an H200 host R2's 4-token step
/// streaming them took 95 ms, four times the single-token hybrid step, so
/// four clients decoded 42.6 tok/s in total against one's 40 (call
/// 2026-11-29-j, server-np4).
#[allow(clippy::too_many_arguments)]
fn batch_hybrid(
    model: &ModelInfo,
    cm: &CostModel<'_>,
    tensors: &[usize],
    groups: &[Vec<usize>],
    decode: usize,
    par: u64,
    times: &mut [Vec<OpTimes>],
    unsplit: &mut [Vec<Option<HostExec>>],
) -> u32 {
    let weights = |g: &[usize]| g.iter().map(|&k| &model.tensors[tensors[k]]).collect::<Vec<_>>();
    let layers: Vec<&Vec<usize>> = groups.iter().filter(|g| cm.hybrid_applies(&weights(g), par)).collect();
    let at = &times[decode];
    let host: Vec<f64> = layers
        .iter()
        .map(|g| g.iter().map(|&k| at[k].2.max(at[k].3)).sum())
        .collect();
    let split = |g: &[usize], k: u32| cm.hybrid_parts(&weights(g), par, k).seconds(0.0);
    let step = |k: u32| -> f64 { layers.iter().zip(&host).map(|(g, &h)| split(g, k).min(h)).sum() };
    let Some(k) = cm
        .hybrid_shares()
        .into_iter()
        .min_by(|&a, &b| step(a).total_cmp(&step(b)))
    else {
        return 0;
    };
    let mut any = false;
    for (g, h) in layers.into_iter().zip(host) {
        let secs = split(g, k);
        if secs >= h {
            continue;
        }
        any = true;
        for &j in g.iter() {
            let (r, e, h, link) = times[decode][j];
            unsplit[decode][j] = Some((e, h, link));
            times[decode][j] = (r, Exec::Hybrid, secs / g.len() as f64, 0.0);
        }
    }
    if any {
        k
    } else {
        0
    }
}

/// A layer whose routed experts may split between the GPU and the CPU.
struct HybridLayer {
    group: Vec<usize>,
    /// (GPU experts per token, the layer's parts).
    shares: Vec<(u32, HybridParts)>,
}

/// What prices the expert cache of single-token decode (patch 0040).
struct CachePricing {
    locality: Locality,
    /// Bytes of the compute buffers that the decode graph leaves unused.
    compute_room: u64,
    /// Streaming slots, which the cache takes over in decode.
    slots: u32,
    /// Per tensor: one expert's bytes (0 for a tensor that holds no routed
    /// experts), and the seconds of its routed copy in single-token decode.
    expert_bytes: Vec<u64>,
    routed_copy: Vec<f64>,
    n_expert: u32,
    n_used: u32,
}

/// The expert cache in one decode step: the seconds it saves, and the
/// share of each token's experts hybrid layers then run on the GPU.
struct CacheStep {
    saved: f64,
    hybrid_k: u32,
    /// None where the positions are fewer than a step routes: the
    /// scheduler streams through the slots then.
    plan: Option<ExpertCachePlan>,
}

/// The row-split candidates of one decode step: how many, their parts, and
/// their seconds and link seconds unsplit (each weight's own best exec).
#[derive(Debug, Clone, Copy, Default)]
struct SplitSums {
    n: u32,
    /// Layers with a split weight.
    layers: u32,
    parts: SplitParts,
    alone: (f64, f64),
    /// Seconds of the step's other ops on the CPU, which the copies slow.
    cpu_other: f64,
}

/// The decode phase of a plan as the planner prices it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodePhase {
    pub decode_tok_s: f64,
    /// The share of each token's routed experts hybrid layers run on the
    /// GPU (0: none is hybrid).
    pub hybrid_gpu_experts: u32,
    pub expert_cache: Option<ExpertCachePlan>,
}

/// The decode phase of `plan`, made by [`super::make_plan`] for `req`: its
/// decode tier's planned weights resident where it has one, and the expert
/// cache in the room that phase leaves (the slots, and what the compute
/// buffers of that phase leave unused).
pub fn decode_phase(model: &ModelInfo, cm: &CostModel<'_>, req: &PlanRequest, plan: &Plan) -> DecodePhase {
    let (p, compute) = match &plan.decode_tier {
        Some(t) => (plan.decoding(t.planned().len()), t.compute),
        None => (plan.clone(), plan.vram.compute),
    };
    let mut ev = Evaluator::new(model, cm, p.workload, p.ubatch, p.kv_gpu_layers);
    ev.price_cache(model, cm, decode_room(model, req, compute), p.stream_slots);
    let resident = residency(&ev, model, &p);
    DecodePhase {
        decode_tok_s: ev.decode_speed(&resident).0,
        hybrid_gpu_experts: ev.hybrid_gpu_experts(&resident),
        expert_cache: ev.expert_cache(&resident),
    }
}

/// Which of `ev`'s tensors `plan` keeps resident.
pub(super) fn residency(ev: &Evaluator, model: &ModelInfo, plan: &Plan) -> Vec<bool> {
    ev.tensors
        .iter()
        .map(|&i| {
            plan.tensors
                .iter()
                .any(|t| t.name == model.tensors[i].name && t.resident)
        })
        .collect()
}

/// Predicted TTFT and decode speed of a finished plan.
pub fn predict(model: &ModelInfo, cm: &CostModel<'_>, plan: &Plan) -> Prediction {
    let ev = Evaluator::new(model, cm, plan.workload, plan.ubatch, plan.kv_gpu_layers);
    let resident = residency(&ev, model, plan);
    ev.evaluate(&resident)
}
