//! Rendering a plan for people (a table) and programs (YAML, JSON).

use std::fmt::Write;

use super::{fmt_bytes, Exec, Plan};

/// Output formats of `pipeshard plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Yaml,
    Json,
}

fn exec_name(e: Exec) -> &'static str {
    match e {
        Exec::Resident => "gpu",
        Exec::Stream => "stream",
        Exec::Cpu => "cpu",
        Exec::Hybrid => "hybrid",
        Exec::Split => "split",
    }
}

/// Render `plan` in `format`.
pub fn render(plan: &Plan, format: Format) -> String {
    match format {
        Format::Yaml => serde_yaml::to_string(plan).unwrap_or_default(),
        Format::Json => serde_json::to_string_pretty(plan).unwrap_or_default(),
        Format::Table => table(plan),
    }
}

fn table(plan: &Plan) -> String {
    let mut s = String::new();
    let v = &plan.vram;
    let _ = writeln!(
        s,
        "model {}: {} layers, ubatch {}, tiers {:?}",
        plan.model, plan.n_layer, plan.ubatch, plan.tiers
    );
    let _ = writeln!(
        s,
        "VRAM {} of {}: weights {}, KV cache {} ({} of {} layers on GPU), compute {}, stream slots {} ({} x {}) + {} streaming overhead, reserve {}",
        fmt_bytes(v.total),
        fmt_bytes(v.budget),
        fmt_bytes(v.weights),
        fmt_bytes(v.kv_cache),
        plan.kv_gpu_layers,
        plan.n_layer,
        fmt_bytes(v.compute),
        fmt_bytes(v.stream_slots),
        plan.stream_slots,
        fmt_bytes(v.stream_slots / plan.stream_slots.max(1) as u64),
        fmt_bytes(v.stream_overhead),
        fmt_bytes(v.reserve)
    );
    if v.vision_peak > 0 {
        let _ = writeln!(
            s,
            "vision encoder: {} while an image is encoded; the language model's compute peak ({}) is released meanwhile, so the larger of the two counts",
            fmt_bytes(v.vision_peak),
            fmt_bytes(v.language_peak())
        );
    }
    if let Some(m) = v.measured {
        let _ = writeln!(
            s,
            "checked with llama.cpp's no-alloc reservation: {} reserved on the GPU (+ {} reserve)",
            fmt_bytes(m),
            fmt_bytes(v.reserve)
        );
    }
    let p = &plan.predicted;
    let par = plan.workload.decode_tokens();
    let _ = writeln!(
        s,
        "predicted for {} prompt + {} generated tokens{}: TTFT {:.3} s ({:.0} tok/s), decode {:.1} tok/s{} ({:?} streaming, host weights {})",
        plan.workload.prompt_tokens,
        plan.workload.gen_tokens,
        if par > 1 {
            format!(" in each of {par} sequences decoding together (tier n={par})")
        } else {
            String::new()
        },
        p.ttft_s,
        p.prompt_tok_s,
        p.decode_tok_s,
        if par > 1 { " in total" } else { "" },
        plan.streaming,
        if plan.pinned { "pinned" } else { "pageable" }
    );
    if let Some(t) = &plan.decode_tier {
        let _ = writeln!(
            s,
            "decode tier: after the prompt, the compute buffers shrink to {} at ubatch {} and {} more weights ({}) are resident while decoding, until the next prompt: predicted decode {:.1} tok/s; up to {} more ({}) where the process holds less outside llama.cpp's buffers than the plan allows",
            fmt_bytes(t.compute),
            t.ubatch,
            t.planned().iter().map(|u| u.weights.len()).sum::<usize>(),
            fmt_bytes(t.bytes()),
            t.predicted_decode_tok_s,
            t.units[t.planned().len()..].iter().map(|u| u.weights.len()).sum::<usize>(),
            fmt_bytes(t.all_bytes() - t.bytes()),
        );
    }
    if let (Some(w), Some(sp)) = (plan.workload.speculation, p.speculation) {
        let _ = writeln!(
            s,
            "speculative decoding: the draft ({}) reads the prompt in {:.3} s; each step drafts {} tokens ({:.2} ms each) and verifies them in one batch of {} ({:.1} ms, tier n={}); {:.2} tokens per step if each draft token is accepted with probability {:.2}; {:.1} tok/s without the draft",
            if w.draft_on_gpu { "GPU" } else { "CPU" },
            w.draft_prompt_s,
            w.draft_tokens,
            w.draft_token_s * 1e3,
            w.verify_tokens(),
            sp.verify_s * 1e3,
            w.verify_tokens(),
            sp.tokens_per_step,
            w.acceptance,
            sp.plain_decode_tok_s
        );
    }
    if plan.exact {
        let _ = writeln!(
            s,
            "exact: every op runs on the GPU (host weights streamed, attention over host KV after a copy): token for token the full-GPU result"
        );
    }
    if plan.hybrid_gpu_experts > 0 {
        let _ = writeln!(
            s,
            "hybrid experts: in decode, the GPU copies and computes {} of each token's routed experts in the layers marked hybrid, while the CPU computes the others",
            plan.hybrid_gpu_experts
        );
    }
    if plan.batch_gpu_experts > 0 {
        let _ = writeln!(
            s,
            "hybrid experts of {} sequences decoding together: the GPU copies and computes {} of each token's routed experts in the layers marked hybrid at n={}, while the CPU computes the others",
            plan.workload.decode_tokens(),
            plan.batch_gpu_experts,
            plan.workload.decode_tokens()
        );
    }
    if let Some(c) = &plan.expert_cache {
        let _ = writeln!(
            s,
            "expert cache: in decode, {} experts of each of {} routed weights stay on the GPU ({}), priced to hold {:.0}% of the experts the GPU computes (routing locality: LRU hits {:.0}% and {:.0}% at 12.5% and 25% of the experts)",
            c.positions,
            c.weights,
            fmt_bytes(c.bytes),
            c.hits * 100.0,
            c.locality.lru_hit_12_5 * 100.0,
            c.locality.lru_hit_25 * 100.0
        );
    }
    if plan.row_split_share > 0.0 {
        let n = plan
            .tensors
            .iter()
            .filter(|t| !t.gpu_share.is_empty() && super::is_dense_ffn(&t.role))
            .count();
        let down = if plan.row_split_down_whole {
            " (up and gate; ffn_down streams whole)"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "row split: in decode, the GPU streams and computes {:.1}% of the rows of {n} feed-forward weights marked split{down}, while the CPU computes the others in place",
            plan.row_split_share * 100.0
        );
    }
    for t in plan.tensors.iter().filter(|t| !super::is_dense_ffn(&t.role)) {
        if let Some(&(_, share)) = t.gpu_share.first() {
            let _ = writeln!(
                s,
                "{}: in decode, the GPU streams and computes {:.0}% of its rows, in parts of at most {} (a streaming slot each), while the CPU computes the others in place",
                t.name,
                share * 100.0,
                fmt_bytes(plan.row_split_part_bytes())
            );
        }
    }
    if plan.cpu_weight_copies {
        let _ = writeln!(
            s,
            "CPU copies: the CPU computes its part from copies of those weights in its repacked layout, {} of host memory beside them",
            fmt_bytes(plan.cpu_copy_bytes())
        );
    }
    if plan.stream_routed_max > 0 {
        let _ = writeln!(
            s,
            "routed streaming: expert matmuls with at most {} (token, expert) pairs copy only the experts they use",
            plan.stream_routed_max
        );
    }
    let _ = writeln!(s);
    // Group identical layer layouts so the table stays short.
    let _ = writeln!(
        s,
        "{:<10} {:<16} {:>10}  {}",
        "layers",
        "tensor",
        "size",
        plan.tiers
            .iter()
            .map(|t| format!("n={t:<6}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut rows: Vec<(String, String, u64, String)> = Vec::new();
    for t in &plan.tensors {
        let short = match t.layer {
            Some(l) => t
                .name
                .trim_start_matches(&format!("blk.{l}."))
                .trim_end_matches(".weight")
                .to_string(),
            None if t.tied => format!("{} (tied)", t.name.trim_end_matches(".weight")),
            None => t.name.trim_end_matches(".weight").to_string(),
        };
        let cols = t
            .exec
            .iter()
            .map(|(_, e)| format!("{:<8}", exec_name(*e)))
            .collect::<Vec<_>>()
            .join(" ");
        let layer = t.layer.map_or("-".to_string(), |l| l.to_string());
        rows.push((layer, short, t.bytes, cols));
    }
    // Merge consecutive layers with the same tensor layout.
    let mut i = 0;
    while i < rows.len() {
        let (l0, name, bytes, cols) = rows[i].clone();
        let mut j = i;
        let mut last = l0.clone();
        while let Some(next) = rows.iter().skip(j + 1).find(|r| r.1 == name) {
            let nl: usize = next.0.parse().unwrap_or(usize::MAX);
            let ll: usize = last.parse().unwrap_or(usize::MAX - 1);
            if nl == ll + 1 && next.3 == cols {
                last = next.0.clone();
                j = rows.iter().position(|r| r == next).unwrap_or(j + 1);
            } else {
                break;
            }
        }
        let span = if last == l0 { l0.clone() } else { format!("{l0}-{last}") };
        let _ = writeln!(s, "{span:<10} {name:<16} {:>10}  {cols}", fmt_bytes(bytes));
        // Skip the rows folded into this one.
        let folded: Vec<String> = if last == l0 {
            vec![]
        } else {
            let a: usize = l0.parse().unwrap_or(0);
            let b: usize = last.parse().unwrap_or(0);
            (a + 1..=b).map(|x| x.to_string()).collect()
        };
        rows.retain(|r| !(r.1 == name && folded.contains(&r.0)));
        i += 1;
    }
    s
}

/// Render a plan across devices in `format`: the split, then each device's
/// plan.
pub fn render_devices(plan: &super::devices::DevicesPlan, format: Format) -> String {
    match format {
        Format::Yaml => serde_yaml::to_string(plan).unwrap_or_default(),
        Format::Json => serde_json::to_string_pretty(plan).unwrap_or_default(),
        Format::Table => devices_table(plan),
    }
}

fn devices_table(plan: &super::devices::DevicesPlan) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "model {}: {} layers across {} devices in the pipeline order of llama.cpp's layer split, ubatch {}; one scheduler copy (llama.cpp's pipeline parallelism does not run with tensor overrides), so the devices take turns",
        plan.model,
        plan.n_layer,
        plan.parts.len(),
        plan.ubatch
    );
    let split = plan.layer_split();
    let _ = writeln!(
        s,
        "layers as llama.cpp's layer split places them: -sm layer -dev {} -ngl {} -ts {}",
        plan.parts
            .iter()
            .map(|p| p.device.as_str())
            .collect::<Vec<_>>()
            .join(","),
        split.n_gpu_layers,
        split
            .tensor_split
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    for part in &plan.parts {
        let (p, v) = (&part.plan, &part.plan.vram);
        let _ = writeln!(
            s,
            "{:<8} layers {:>3}-{:<3} VRAM {} of {}: weights {}, KV {}, compute {}; host weights {}; alone: TTFT {:.3} s, decode {:.1} tok/s",
            part.device,
            part.first_layer,
            part.end_layer() - 1,
            fmt_bytes(v.total),
            fmt_bytes(v.budget),
            fmt_bytes(v.weights),
            fmt_bytes(v.kv_cache),
            fmt_bytes(v.compute),
            fmt_bytes(p.host_bytes()),
            p.predicted.ttft_s,
            p.predicted.decode_tok_s
        );
    }
    let (p, w) = (
        &plan.predicted,
        plan.parts.first().map(|p| p.plan.workload).unwrap_or_default(),
    );
    let _ = writeln!(
        s,
        "predicted for {} prompt + {} generated tokens: TTFT {:.3} s ({:.0} tok/s), decode {:.1} tok/s",
        w.prompt_tokens, w.gen_tokens, p.ttft_s, p.prompt_tok_s, p.decode_tok_s
    );
    for part in &plan.parts {
        let _ = writeln!(
            s,
            "\n{} (layers {}-{}):",
            part.device,
            part.first_layer,
            part.end_layer() - 1
        );
        s.push_str(&table(&part.plan));
    }
    s
}
