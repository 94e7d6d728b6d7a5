//! llama-server's command line and `LLAMA_ARG_*` environment, parsed the way
//! upstream parses them (`common/arg.cpp`): environment first, flags override
//! it; `--foo_bar` equals `--foo-bar`; multi-letter short forms (`-np`,
//! `-ngl`, `-ctk`, ...) are ordinary spellings. Options pipeshard does not
//! implement are accepted with one warning each, unless ignoring them would
//! change results; those are refused with a clear error.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::engine::FlashAttention;

use super::config::ServerConfig;
use super::upstream_args::{UpstreamOpt, UPSTREAM_OPTS};

/// A command line that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error("invalid argument: {0}")]
    Unknown(String),
    #[error("expected value for argument {0}")]
    MissingValue(String),
    #[error("invalid value {value:?} for {name}: {reason}")]
    BadValue {
        name: String,
        value: String,
        reason: String,
    },
    #[error("{0} is not supported by pipeshard-server: {1}")]
    Unsupported(String, String),
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Parsed {
    /// Serve with this configuration; `warnings` lists ignored options.
    Serve {
        config: Box<ServerConfig>,
        warnings: Vec<String>,
    },
    /// Print this help text and exit.
    Help(String),
    /// Print the version and exit.
    Version,
}

/// pipeshard's own options, parsed next to llama-server's.
static PIPESHARD_OPTS: &[UpstreamOpt] = &[
    UpstreamOpt {
        names: &["--vram-budget"],
        negated: &[],
        values: 1,
        env: Some("PIPESHARD_VRAM_BUDGET"),
    },
    UpstreamOpt {
        names: &["--profile"],
        negated: &[],
        values: 1,
        env: Some("PIPESHARD_PROFILE"),
    },
    UpstreamOpt {
        names: &["--plan"],
        negated: &[],
        values: 1,
        env: Some("PIPESHARD_PLAN"),
    },
    UpstreamOpt {
        names: &["--stream-slots"],
        negated: &[],
        values: 1,
        env: Some("PIPESHARD_STREAM_SLOTS"),
    },
    UpstreamOpt {
        names: &["--hybrid-experts"],
        negated: &[],
        values: 1,
        env: Some("PIPESHARD_HYBRID_EXPERTS"),
    },
    UpstreamOpt {
        names: &["--backend-dir"],
        negated: &[],
        values: 1,
        env: Some("PIPESHARD_BACKEND_DIR"),
    },
    UpstreamOpt {
        names: &["--max-body-size"],
        negated: &[],
        values: 1,
        env: Some("PIPESHARD_MAX_BODY_SIZE"),
    },
    UpstreamOpt {
        names: &["--media-dir"],
        negated: &[],
        values: 1,
        env: Some("PIPESHARD_MEDIA_DIR"),
    },
];

/// Options refused because ignoring them would change what the server
/// returns, unless their value is the neutral one listed.
static REFUSED: &[(&str, &[&str], &str)] = &[
    ("--lora", &[], "LoRA adapters are not implemented"),
    ("--lora-scaled", &[], "LoRA adapters are not implemented"),
    ("--control-vector", &[], "control vectors are not implemented"),
    ("--control-vector-scaled", &[], "control vectors are not implemented"),
    (
        "--control-vector-layer-range",
        &[],
        "control vectors are not implemented",
    ),
    ("--rope-scaling", &[], "RoPE overrides are not implemented"),
    ("--rope-scale", &[], "RoPE overrides are not implemented"),
    ("--rope-freq-base", &[], "RoPE overrides are not implemented"),
    ("--rope-freq-scale", &[], "RoPE overrides are not implemented"),
    ("--yarn-orig-ctx", &[], "YaRN overrides are not implemented"),
    ("--yarn-ext-factor", &[], "YaRN overrides are not implemented"),
    ("--yarn-attn-factor", &[], "YaRN overrides are not implemented"),
    ("--yarn-beta-slow", &[], "YaRN overrides are not implemented"),
    ("--yarn-beta-fast", &[], "YaRN overrides are not implemented"),
    ("--override-kv", &[], "metadata overrides are not implemented"),
    (
        "--grammar",
        &[""],
        "a server-wide grammar is not implemented (send `grammar` per request)",
    ),
    (
        "--grammar-file",
        &[],
        "a server-wide grammar is not implemented (send `grammar` per request)",
    ),
    (
        "--json-schema",
        &[],
        "a server-wide JSON schema is not implemented (send `json_schema` per request)",
    ),
    (
        "--json-schema-file",
        &[],
        "a server-wide JSON schema is not implemented (send `json_schema` per request)",
    ),
    ("--samplers", &[], "custom sampler orders are not implemented"),
    ("--sampler-seq", &[], "custom sampler orders are not implemented"),
    ("--mirostat", &["0"], "mirostat sampling is not implemented"),
    (
        "--dynatemp-range",
        &["0", "0.0"],
        "dynamic temperature is not implemented",
    ),
    ("--xtc-probability", &["0", "0.0"], "XTC sampling is not implemented"),
    ("--typical", &["1", "1.0"], "typical sampling is not implemented"),
    (
        "--top-nsigma",
        &["-1", "-1.0"],
        "top-n-sigma sampling is not implemented",
    ),
    ("--dry-multiplier", &["0", "0.0"], "DRY sampling is not implemented"),
    ("--logit-bias", &[], "a server-wide logit bias is not implemented"),
    ("--pooling", &["mean"], "only mean pooling is implemented"),
    ("--rerank", &[], "the rerank endpoint is not implemented"),
    (
        "--hf-repo",
        &[],
        "downloading models is not implemented; pass -m FILE.gguf",
    ),
    (
        "--hf-file",
        &[],
        "downloading models is not implemented; pass -m FILE.gguf",
    ),
    (
        "--model-url",
        &[],
        "downloading models is not implemented; pass -m FILE.gguf",
    ),
    (
        "--docker-repo",
        &[],
        "downloading models is not implemented; pass -m FILE.gguf",
    ),
    (
        "--mmproj-url",
        &[],
        "downloading models is not implemented; pass --mmproj FILE.gguf",
    ),
    ("--models-dir", &[], "router mode (several models) is not implemented"),
    (
        "--models-preset",
        &[],
        "router mode (several models) is not implemented",
    ),
    (
        "--ssl-key-file",
        &[],
        "TLS is not implemented; put a TLS proxy in front",
    ),
    (
        "--ssl-cert-file",
        &[],
        "TLS is not implemented; put a TLS proxy in front",
    ),
    ("--spm-infill", &[], "infill is not implemented"),
];

fn truthy(v: &str) -> bool {
    matches!(v, "on" | "enabled" | "true" | "1")
}

fn falsey(v: &str) -> bool {
    matches!(v, "off" | "disabled" | "false" | "0")
}

/// A value an option was given.
#[derive(Debug, Clone)]
enum Val {
    Flag(bool),
    One(String),
    /// Two values (only `--control-vector-layer-range`, which is refused).
    Two,
}

/// Everything given on the command line or in the environment, by option key.
struct Given {
    vals: HashMap<&'static str, (Val, String)>,
    used: Vec<&'static str>,
}

impl Given {
    fn take(&mut self, key: &'static str) -> Option<(Val, String)> {
        let v = self.vals.get(key).cloned();
        if v.is_some() {
            self.used.push(key);
        }
        v
    }

    fn flag(&mut self, key: &'static str) -> Option<bool> {
        self.take(key).map(|(v, _)| match v {
            Val::Flag(b) => b,
            Val::One(s) => truthy(&s),
            Val::Two => true,
        })
    }

    fn string(&mut self, key: &'static str) -> Option<(String, String)> {
        self.take(key).and_then(|(v, origin)| match v {
            Val::One(s) => Some((s, origin)),
            _ => None,
        })
    }

    fn parse<T: std::str::FromStr>(&mut self, key: &'static str) -> Result<Option<T>, ArgsError>
    where
        T::Err: std::fmt::Display,
    {
        match self.string(key) {
            None => Ok(None),
            Some((s, origin)) => s.trim().parse::<T>().map(Some).map_err(|e| ArgsError::BadValue {
                name: origin,
                value: s,
                reason: e.to_string(),
            }),
        }
    }
}

fn all_opts() -> impl Iterator<Item = &'static UpstreamOpt> {
    UPSTREAM_OPTS.iter().chain(PIPESHARD_OPTS.iter())
}

/// Parse a byte size ("6GiB", "512M", plain bytes): the planner's parser.
pub fn parse_bytes(s: &str) -> Option<u64> {
    crate::plan::parse_bytes(s).ok()
}

fn gather(argv: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Given>, ArgsError> {
    let mut by_name: HashMap<&'static str, (&'static UpstreamOpt, bool)> = HashMap::new();
    for o in all_opts() {
        for n in o.names {
            by_name.insert(n, (o, true));
        }
        for n in o.negated {
            by_name.insert(n, (o, false));
        }
    }
    let mut vals: HashMap<&'static str, (Val, String)> = HashMap::new();
    for o in all_opts() {
        let Some(var) = o.env else { continue };
        if !o.negated.is_empty() {
            let neg = var.replacen("LLAMA_ARG_", "LLAMA_ARG_NO_", 1);
            if env(&neg).is_some() {
                vals.insert(o.key(), (Val::Flag(false), neg));
                continue;
            }
        }
        let Some(v) = env(var) else { continue };
        let val = match (o.values, o.negated.is_empty()) {
            (0, true) => Val::Flag(truthy(&v)),
            (0, false) if truthy(&v) => Val::Flag(true),
            (0, false) if falsey(&v) => Val::Flag(false),
            (0, false) => {
                return Err(ArgsError::BadValue {
                    name: var.into(),
                    value: v,
                    reason: "not a boolean".into(),
                })
            }
            _ => Val::One(v),
        };
        vals.insert(o.key(), (val, var.to_string()));
    }
    let mut i = 0;
    while i < argv.len() {
        let raw = &argv[i];
        i += 1;
        let (mut name, inline) = match raw.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (raw.clone(), None),
        };
        if name.starts_with("--") {
            name = name.replace('_', "-");
        }
        let Some(&(o, positive)) = by_name.get(name.as_str()) else {
            return Err(ArgsError::Unknown(raw.clone()));
        };
        if matches!(o.key(), "--help") {
            return Ok(None);
        }
        let mut next = |inline: &mut Option<String>| -> Result<String, ArgsError> {
            if let Some(v) = inline.take() {
                return Ok(v);
            }
            let v = argv
                .get(i)
                .cloned()
                .ok_or_else(|| ArgsError::MissingValue(name.clone()))?;
            i += 1;
            Ok(v)
        };
        let mut inline = inline;
        let val = match (o.values, positive) {
            (_, false) => Val::Flag(false),
            (0, true) => Val::Flag(true),
            (1, true) => Val::One(next(&mut inline)?),
            _ => {
                next(&mut inline)?;
                next(&mut inline)?;
                Val::Two
            }
        };
        vals.insert(o.key(), (val, name.clone()));
    }
    Ok(Some(Given { vals, used: Vec::new() }))
}

/// The usage text: every accepted option with its environment variable.
pub fn help_text() -> String {
    let mut s = String::from(
        "pipeshard-server: a drop-in replacement for llama-server\n\n\
         usage: pipeshard-server -m MODEL.gguf [llama-server options] [pipeshard options]\n\n\
         pipeshard options:\n  \
         --vram-budget BYTES     VRAM budget, e.g. 6GiB (env PIPESHARD_VRAM_BUDGET)\n  \
         --profile FILE          machine profile (env PIPESHARD_PROFILE)\n  \
         --plan FILE             placement plan (env PIPESHARD_PLAN)\n  \
         --stream-slots N        device slots for streamed weights, 0-8, default 4 (env PIPESHARD_STREAM_SLOTS)\n  \
         --hybrid-experts K      routed experts per token the GPU computes in decode, 0 off; default: the plan's (env PIPESHARD_HYBRID_EXPERTS)\n  \
         --backend-dir DIR       ggml backend modules (env PIPESHARD_BACKEND_DIR)\n  \
         --max-body-size BYTES   largest request body, default 64MiB (env PIPESHARD_MAX_BODY_SIZE)\n  \
         --media-dir DIR         let image_url name local files under DIR (env PIPESHARD_MEDIA_DIR)\n\n\
         llama-server options (see llama-server --help for their meaning):\n",
    );
    for o in UPSTREAM_OPTS {
        let mut line = format!("  {}", o.names.join(", "));
        if !o.negated.is_empty() {
            line.push_str(&format!(" / {}", o.negated.join(", ")));
        }
        for _ in 0..o.values {
            line.push_str(" V");
        }
        if let Some(e) = o.env {
            line.push_str(&format!("  (env {e})"));
        }
        s.push_str(&line);
        s.push('\n');
    }
    s
}

/// Parse llama-server's arguments (without the program name) and
/// environment into a [`ServerConfig`].
pub fn parse(argv: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Parsed, ArgsError> {
    let Some(mut g) = gather(argv, env)? else {
        return Ok(Parsed::Help(help_text()));
    };
    if g.flag("--version").unwrap_or(false) {
        return Ok(Parsed::Version);
    }
    let mut c = ServerConfig::default();
    let bad = |name: &str, value: &str, reason: &str| ArgsError::BadValue {
        name: name.into(),
        value: value.into(),
        reason: reason.into(),
    };

    c.model = g.string("--model").map(|(s, _)| PathBuf::from(s));
    if let Some((s, _)) = g.string("--alias") {
        c.alias = s
            .split(',')
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
    }
    if let Some((s, _)) = g.string("--host") {
        c.host = s;
    }
    if let Some(p) = g.parse::<u16>("--port")? {
        c.port = p;
    }
    if let Some(n) = g.parse::<i64>("--ctx-size")? {
        c.n_ctx = u32::try_from(n).map_err(|_| bad("--ctx-size", &n.to_string(), "must be >= 0"))?;
    }
    if let Some(n) = g.parse::<i64>("--parallel")? {
        c.n_parallel = match n {
            -1 => 4,
            1..=256 => n as u32,
            _ => return Err(bad("--parallel", &n.to_string(), "must be -1 (auto) or 1..=256")),
        };
    }
    for (key, slot) in [("--batch-size", &mut c.n_batch), ("--ubatch-size", &mut c.n_ubatch)] {
        if let Some(n) = g.parse::<u32>(key)? {
            if n == 0 {
                return Err(bad(key, "0", "must be positive"));
            }
            *slot = n;
        }
    }
    if let Some((s, origin)) = g.string("--gpu-layers") {
        c.n_gpu_layers = match s.as_str() {
            "auto" | "all" => -1,
            _ => s.parse::<i32>().map_err(|e| bad(&origin, &s, &e.to_string()))?,
        };
    }
    if let Some((s, origin)) = g.string("--flash-attn") {
        c.flash_attention = if truthy(&s) {
            FlashAttention::On
        } else if falsey(&s) {
            FlashAttention::Off
        } else if s == "auto" || s == "-1" {
            FlashAttention::Auto
        } else {
            return Err(bad(&origin, &s, "expected on, off or auto"));
        };
    }
    c.threads = g.parse::<i32>("--threads")?.filter(|&t| t > 0);
    c.threads_batch = g.parse::<i32>("--threads-batch")?.filter(|&t| t > 0);
    for (key, slot) in [
        ("--cache-type-k", &mut c.cache_type_k),
        ("--cache-type-v", &mut c.cache_type_v),
    ] {
        if let Some((s, origin)) = g.string(key) {
            let s = s.to_ascii_lowercase();
            if !matches!(
                s.as_str(),
                "f32" | "f16" | "bf16" | "q8_0" | "q4_0" | "q4_1" | "iq4_nl" | "q5_0" | "q5_1"
            ) {
                return Err(bad(&origin, &s, "unsupported KV cache type"));
            }
            *slot = Some(s);
        }
    }
    if let Some(b) = g.flag("--kv-offload") {
        c.kv_offload = b;
    }
    if let Some(b) = g.flag("--op-offload") {
        c.op_offload = b;
    }
    if let Some(b) = g.flag("--kv-unified") {
        c.kv_unified = b;
    }
    if let Some(b) = g.flag("--repack") {
        c.repack = b;
    }
    if let Some((s, origin)) = g.string("--load-mode") {
        c.use_mmap = match s.as_str() {
            "mmap" => true,
            "none" | "read" | "direct" | "dio" => false,
            _ => {
                tracing::debug!("--load-mode {s} treated as mmap");
                let _ = origin;
                true
            }
        };
    }
    if let Some((s, origin)) = g.string("--override-tensor") {
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (pat, buft) = part
                .split_once('=')
                .ok_or_else(|| bad(&origin, part, "expected <tensor name pattern>=<buffer type>"))?;
            c.tensor_overrides.push((pat.to_string(), buft.to_string()));
        }
    }
    if g.flag("--cpu-moe").unwrap_or(false) {
        c.tensor_overrides
            .push((r"\.ffn_(up|down|gate)_(ch|)exps".into(), "CPU".into()));
    }
    if let Some(n) = g.parse::<u32>("--n-cpu-moe")? {
        for i in 0..n {
            c.tensor_overrides
                .push((format!(r"blk\.{i}\.ffn_(up|down|gate)_(ch|)exps"), "CPU".into()));
        }
    }
    if let Some((s, _)) = g.string("--api-key") {
        c.api_keys
            .extend(s.split(',').map(str::trim).filter(|k| !k.is_empty()).map(String::from));
    }
    if let Some((f, origin)) = g.string("--api-key-file") {
        let text = std::fs::read_to_string(&f).map_err(|e| bad(&origin, &f, &e.to_string()))?;
        c.api_keys
            .extend(text.lines().map(str::trim).filter(|k| !k.is_empty()).map(String::from));
    }
    c.endpoint_metrics = g.flag("--metrics").unwrap_or(false);
    c.endpoint_props = g.flag("--props").unwrap_or(false);
    c.endpoint_slots = g.flag("--slots").unwrap_or(true);
    c.jinja = g.flag("--jinja");
    c.chat_template = g.string("--chat-template").map(|(s, _)| s);
    if let Some((f, origin)) = g.string("--chat-template-file") {
        c.chat_template = Some(std::fs::read_to_string(&f).map_err(|e| bad(&origin, &f, &e.to_string()))?);
        c.jinja.get_or_insert(true);
    }
    if let Some((s, origin)) = g.string("--chat-template-kwargs") {
        match serde_json::from_str::<serde_json::Value>(&s) {
            Ok(serde_json::Value::Object(m)) => c.chat_template_kwargs = m,
            _ => return Err(bad(&origin, &s, "expected a JSON object")),
        }
    }
    c.mmproj = g.string("--mmproj").map(|(s, _)| PathBuf::from(s));
    if let Some(b) = g.flag("--mmproj-offload") {
        c.mmproj_offload = b;
    }
    if g.flag("--mmproj-auto") == Some(false) {
        c.mmproj = None;
    }
    c.embeddings = g.flag("--embedding").unwrap_or(false);
    if let Some(n) = g.parse::<i32>("--embd-normalize")? {
        c.embd_normalize = n;
    }
    if let Some(b) = g.flag("--cache-prompt") {
        c.cache_prompt = b;
    }
    if let Some(n) = g.parse::<u64>("--timeout")? {
        c.timeout_s = n;
    }
    if let Some(n) = g.parse::<i32>("--predict")? {
        c.n_predict = n;
    }
    let s = &mut c.sampling;
    if let Some(v) = g.parse::<f32>("--temp")? {
        s.temperature = v;
    }
    if let Some(v) = g.parse::<i32>("--top-k")? {
        s.top_k = v;
    }
    if let Some(v) = g.parse::<f32>("--top-p")? {
        s.top_p = v;
    }
    if let Some(v) = g.parse::<f32>("--min-p")? {
        s.min_p = v;
    }
    if let Some(v) = g.parse::<f32>("--repeat-penalty")? {
        s.repeat_penalty = v;
    }
    if let Some(v) = g.parse::<i32>("--repeat-last-n")? {
        s.repeat_last_n = v;
    }
    if let Some(v) = g.parse::<f32>("--presence-penalty")? {
        s.presence_penalty = v;
    }
    if let Some(v) = g.parse::<f32>("--frequency-penalty")? {
        s.frequency_penalty = v;
    }
    if let Some(v) = g.parse::<i64>("--seed")? {
        s.seed = if v < 0 { u32::MAX } else { v as u32 };
    }
    c.ignore_eos = g.flag("--ignore-eos").unwrap_or(false);
    c.special = g.flag("--special").unwrap_or(false);
    if let Some((p, _)) = g.string("--api-prefix") {
        c.api_prefix = p.trim_end_matches('/').to_string();
        if !c.api_prefix.is_empty() && !c.api_prefix.starts_with('/') {
            c.api_prefix.insert(0, '/');
        }
    }
    c.log_disable = g.flag("--log-disable").unwrap_or(false);
    if g.flag("--verbose").unwrap_or(false) {
        c.verbosity = 2;
    }
    if let Some(n) = g.parse::<i32>("--verbosity")? {
        c.verbosity = n.clamp(0, 4) as u8;
    }
    if let Some((s, origin)) = g.string("--vram-budget") {
        c.vram_budget =
            Some(parse_bytes(&s).ok_or_else(|| bad(&origin, &s, "expected bytes, e.g. 6GiB or 6442450944"))?);
    }
    c.profile = g.string("--profile").map(|(s, _)| PathBuf::from(s));
    c.plan = g.string("--plan").map(|(s, _)| PathBuf::from(s));
    if let Some((s, origin)) = g.string("--stream-slots") {
        c.stream_slots = s
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n <= 8)
            .ok_or_else(|| bad(&origin, &s, "expected 0 to 8"))?;
    }
    if let Some(k) = g.parse::<u32>("--hybrid-experts")? {
        c.hybrid_gpu_experts = Some(k);
    }
    c.fit = g.string("--fit").map(|(s, _)| s);
    c.backend_dir = g.string("--backend-dir").map(|(s, _)| PathBuf::from(s));
    if let Some((s, origin)) = g.string("--max-body-size") {
        c.max_body_bytes = parse_bytes(&s).ok_or_else(|| bad(&origin, &s, "expected bytes"))? as usize;
    }
    c.media_dir = g.string("--media-dir").map(|(s, _)| PathBuf::from(s));
    // Accepted for compatibility; continuous batching is always on.
    g.flag("--cont-batching");

    let mut warnings = Vec::new();
    let mut rest: Vec<(&'static str, Val, String)> = g
        .vals
        .iter()
        .filter(|(k, _)| !g.used.contains(k))
        .map(|(k, (v, origin))| (*k, v.clone(), origin.clone()))
        .collect();
    rest.sort_by_key(|(k, _, _)| *k);
    for (key, val, origin) in rest {
        if let Some((_, neutral, why)) = REFUSED.iter().find(|(k, _, _)| *k == key) {
            let is_neutral = match &val {
                Val::One(v) => neutral.contains(&v.trim()),
                Val::Flag(false) => true,
                _ => false,
            };
            if !is_neutral {
                return Err(ArgsError::Unsupported(origin, why.to_string()));
            }
            continue;
        }
        warnings.push(format!(
            "{origin} is not implemented by pipeshard-server and is ignored"
        ));
    }
    if c.n_ubatch > c.n_batch {
        c.n_ubatch = c.n_batch;
    }
    Ok(Parsed::Serve {
        config: Box::new(c),
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<(ServerConfig, Vec<String>), ArgsError> {
        let argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        match parse(&argv, &|k| env.get(k).cloned())? {
            Parsed::Serve { config, warnings } => Ok((*config, warnings)),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn short_multi_letter_forms() {
        let (c, w) = run(
            &[
                "-m", "x.gguf", "-np", "3", "-ngl", "7", "-ub", "64", "-b", "128", "-fa", "on", "-ctk", "q8_0", "-to",
                "9",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.n_parallel, 3);
        assert_eq!(c.n_gpu_layers, 7);
        assert_eq!((c.n_batch, c.n_ubatch), (128, 64));
        assert_eq!(c.flash_attention, FlashAttention::On);
        assert_eq!(c.cache_type_k.as_deref(), Some("q8_0"));
        assert_eq!(c.timeout_s, 9);
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn env_then_flags() {
        let (c, _) = run(
            &["--port", "9000"],
            &[("LLAMA_ARG_PORT", "1"), ("LLAMA_ARG_CTX_SIZE", "512")],
        )
        .unwrap();
        assert_eq!(c.port, 9000);
        assert_eq!(c.n_ctx, 512);
        let (c, _) = run(
            &[],
            &[
                ("LLAMA_ARG_NO_ENDPOINT_SLOTS", "1"),
                ("LLAMA_ARG_ENDPOINT_METRICS", "1"),
            ],
        )
        .unwrap();
        assert!(!c.endpoint_slots);
        assert!(c.endpoint_metrics);
        assert!(c.repack);
        let (c, _) = run(&["--no-repack"], &[]).unwrap();
        assert!(!c.repack);
        let (c, _) = run(&[], &[("LLAMA_ARG_REPACK", "0")]).unwrap();
        assert!(!c.repack);
    }

    #[test]
    fn unknown_is_an_error_unimplemented_a_warning_refused_an_error() {
        assert!(matches!(run(&["--bogus"], &[]), Err(ArgsError::Unknown(_))));
        let (_, w) = run(&["--numa", "distribute", "--no-webui"], &[]).unwrap();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(matches!(
            run(&["--lora", "a.gguf"], &[]),
            Err(ArgsError::Unsupported(..))
        ));
        assert!(run(&["--mirostat", "0"], &[]).is_ok());
        assert!(matches!(run(&["--port"], &[]), Err(ArgsError::MissingValue(_))));
    }

    #[test]
    fn pipeshard_options_and_sizes() {
        let (c, _) = run(&["--vram-budget", "6GiB", "--n-cpu-moe", "2"], &[]).unwrap();
        assert_eq!(c.vram_budget, Some(6 << 30));
        assert_eq!(c.tensor_overrides.len(), 2);
        assert_eq!(c.hybrid_gpu_experts, None);
        let (c, _) = run(&["--hybrid-experts", "3"], &[]).unwrap();
        assert_eq!(c.hybrid_gpu_experts, Some(3));
        let (c, _) = run(&[], &[("PIPESHARD_HYBRID_EXPERTS", "0")]).unwrap();
        assert_eq!(c.hybrid_gpu_experts, Some(0));
        assert!(run(&["--hybrid-experts", "many"], &[]).is_err());
        assert_eq!(parse_bytes("1.5k"), Some(1536));
        assert_eq!(parse_bytes("abc"), None);
    }
}
