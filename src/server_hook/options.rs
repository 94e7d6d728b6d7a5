//! pipeshard's own options of `pipeshard-server` (and `pipeshard serve`),
//! split from the command line that goes, unchanged, to llama.cpp's server.

use std::path::PathBuf;

use clap::Parser;

use crate::launch;

/// The options pipeshard takes itself; every other argument, and every
/// `LLAMA_ARG_*` variable, is llama-server's.
#[derive(Parser, Debug, Clone, Default)]
#[command(
    name = "pipeshard-server",
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true
)]
pub struct ServerOptions {
    /// The options every pipeshard command takes (budget, plan, profile,
    /// streaming slots, hybrid experts, vision streaming slots).
    #[command(flatten)]
    pub pipeshard: launch::PipeshardOptions,
    /// The chance the plan assumes that each draft token (`-md`) is accepted.
    #[arg(long = "draft-acceptance", env = "PIPESHARD_DRAFT_ACCEPTANCE", default_value_t = 0.7,
          value_parser = parse_probability)]
    pub draft_acceptance: f64,
    /// Directory with ggml backend modules (libggml-cpu.so, libggml-cuda.so).
    #[arg(long = "backend-dir", env = "PIPESHARD_BACKEND_DIR")]
    pub backend_dir: Option<PathBuf>,
}

fn parse_probability(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("expected a probability between 0 and 1, not {s:?}")),
    }
}

/// The long names of pipeshard's options; each takes a value.
const OWN_FLAGS: &[&str] = &[
    "--vram-budget",
    "--vram-headroom",
    "--profile",
    "--plan",
    "--stream-slots",
    "--hybrid-experts",
    "--dense-split",
    "--split-tune",
    "--vision-stream-slots",
    "--draft-acceptance",
    "--backend-dir",
];

/// pipeshard's options that take no value.
const OWN_SWITCHES: &[&str] = &["--exact"];

/// The help text of pipeshard's options, printed after llama-server's.
pub const HELP: &str = "\
----- pipeshard -----

--vram-budget BYTES|auto     hard VRAM budget, e.g. 4GiB; pipeshard plans the placement
                             of every weight for it (env: PIPESHARD_VRAM_BUDGET); with
                             auto the budget follows the card's free memory while serving:
                             weights move between VRAM and host memory between batches
--vram-headroom SIZE         with auto: VRAM left free for other programs (default: 5% of
                             the card, at least 512 MiB) (env: PIPESHARD_VRAM_HEADROOM)
--plan FILE                  a saved plan from `pipeshard plan` (env: PIPESHARD_PLAN)
--profile FILE               machine profile for the planner (env: PIPESHARD_PROFILE)
--stream-slots N             device slots for streamed weights, 0-8 (default: 4)
                             (env: PIPESHARD_STREAM_SLOTS)
--hybrid-experts K           routed experts per token the GPU computes in decode, 0 off
                             (default: the plan's) (env: PIPESHARD_HYBRID_EXPERTS)
--dense-split SHARE          share (0-1) of each host feed-forward weight's rows the GPU
                             computes in decode, 0 off (default: the plan's)
                             (env: PIPESHARD_DENSE_SPLIT)
--split-tune BOOL            choose the decode split (hybrid experts, row share) from the
                             first decode steps served: the plan's share and the others
                             around it are timed and the fastest kept (default: true; a share given
                             above is kept) (env: PIPESHARD_SPLIT_TUNE)
--cpu-copies BOOL            hybrid experts and row split: the CPU computes its part from
                             repacked copies of those host weights, where host memory holds
                             them (default: true) (env: PIPESHARD_CPU_COPIES)
--vision-stream-slots N      streaming slots of the vision encoder's weights, 0-8
                             (default: 4) (env: PIPESHARD_VISION_STREAM_SLOTS)
--exact                      GPU math only (host weights streamed, never computed on the CPU):
                             token for token the full-GPU result (env: PIPESHARD_EXACT)
--draft-acceptance P         draft-token acceptance the plan assumes for -md (default: 0.7)
                             (env: PIPESHARD_DRAFT_ACCEPTANCE)
--backend-dir DIR            ggml backend modules (env: PIPESHARD_BACKEND_DIR)

Without --vram-budget or --plan, pipeshard-server is llama-server.";

/// Split `args` (without the program name) into pipeshard's options and
/// the arguments for llama-server, each in its original order.
pub fn split_args(args: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut own, mut upstream) = (Vec::new(), Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let name = a.split_once('=').map_or(a.as_str(), |(n, _)| n);
        if OWN_SWITCHES.contains(&name) {
            own.push(a.clone());
            continue;
        }
        if !OWN_FLAGS.contains(&name) {
            upstream.push(a.clone());
            continue;
        }
        own.push(a.clone());
        if !a.contains('=') {
            if let Some(v) = it.next() {
                own.push(v.clone());
            }
        }
    }
    (own, upstream)
}

impl ServerOptions {
    /// Parse pipeshard's options from `own` (see [`split_args`]) and the
    /// `PIPESHARD_*` variables.
    pub fn parse(own: &[String]) -> Result<ServerOptions, clap::Error> {
        ServerOptions::try_parse_from(own)
    }

    /// Whether pipeshard places the model (a budget or a saved plan);
    /// otherwise the server is upstream's in every respect.
    pub fn plans(&self) -> bool {
        self.pipeshard.is_set()
    }

    /// Files the options name that do not exist.
    pub fn check_files(&self) -> Result<(), String> {
        for (flag, path) in [("--plan", &self.pipeshard.plan), ("--profile", &self.pipeshard.profile)] {
            if let Some(p) = path {
                if !p.is_file() {
                    return Err(format!("{flag} {}: no such file", p.display()));
                }
            }
        }
        if let Some(d) = &self.backend_dir {
            if !d.is_dir() {
                return Err(format!("--backend-dir {}: no such directory", d.display()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn split_keeps_upstream_arguments_in_order() {
        let (own, up) = split_args(&strings(&[
            "-m",
            "x.gguf",
            "--vram-budget",
            "4GiB",
            "-c",
            "4096",
            "--stream-slots=2",
            "--port",
            "8080",
        ]));
        assert_eq!(own, strings(&["--vram-budget", "4GiB", "--stream-slots=2"]));
        assert_eq!(up, strings(&["-m", "x.gguf", "-c", "4096", "--port", "8080"]));
        let o = ServerOptions::parse(&own).unwrap();
        assert_eq!(o.pipeshard.budget_bytes().unwrap(), Some(4 << 30));
        assert_eq!(o.pipeshard.stream_slots, 2);
        assert!(o.plans());
        assert!(!o.pipeshard.exact);
        // A switch takes no value: the argument after it is upstream's.
        let (own, up) = split_args(&strings(&["--vram-budget", "4GiB", "--exact", "-c", "4096"]));
        assert_eq!(own, strings(&["--vram-budget", "4GiB", "--exact"]));
        assert_eq!(up, strings(&["-c", "4096"]));
        assert!(ServerOptions::parse(&own).unwrap().pipeshard.exact);
        // The decode split is tuned unless asked not to.
        assert!(o.pipeshard.split_tune);
        let (own, up) = split_args(&strings(&["--split-tune", "false", "-np", "4"]));
        assert_eq!(up, strings(&["-np", "4"]));
        assert!(!ServerOptions::parse(&own).unwrap().pipeshard.split_tune);
    }

    #[test]
    fn bad_values_are_errors() {
        assert!(ServerOptions::parse(&strings(&["--vram-budget", "lots"])).is_err());
        assert!(ServerOptions::parse(&strings(&["--vram-budget", "0"])).is_err());
        assert!(ServerOptions::parse(&strings(&["--stream-slots", "9"])).is_err());
        assert!(ServerOptions::parse(&strings(&["--draft-acceptance", "1.5"])).is_err());
        assert!(ServerOptions::parse(&strings(&["--split-tune", "maybe"])).is_err());
        // A flag without its value is not silently dropped.
        let (own, _) = split_args(&strings(&["--vram-budget"]));
        assert!(ServerOptions::parse(&own).is_err());
    }
}
