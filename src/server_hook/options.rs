//! pipeshard's own options of `pipeshard-server` (and `pipeshard serve`),
//! split from the command line that goes, unchanged, to llama.cpp's server.

use std::path::PathBuf;

use clap::{CommandFactory, Parser};

use crate::bench::routing::RoutingPoint;
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
    /// For benchmarks only: the MoE routing point, as `pipeshard bench
    /// --routing` (`synthetic`: the model's router as is, as without the
    /// option; `calibrated`; `uniform`), per slot and request.
    #[arg(long = "bench-routing", value_name = "POINT")]
    pub bench_routing: Option<RoutingPoint>,
}

fn parse_probability(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("expected a probability between 0 and 1, not {s:?}")),
    }
}

/// What follows pipeshard's options in `--help`, after llama-server's.
const HELP_TEMPLATE: &str =
    "----- pipeshard -----\n\n{options}\n\nWithout --vram-budget or --plan, pipeshard-server is llama-server.";

/// The help text of pipeshard's options, printed after llama-server's;
/// made from the one definition of the options ([`ServerOptions`]).
pub fn help() -> String {
    ServerOptions::command()
        .help_template(HELP_TEMPLATE)
        .render_help()
        .to_string()
}

/// pipeshard's options as the command line spells them: each long name,
/// and whether it takes a value (from the one definition, [`ServerOptions`]).
fn own_flags() -> Vec<(String, bool)> {
    ServerOptions::command()
        .get_arguments()
        .filter_map(|a| Some((format!("--{}", a.get_long()?), a.get_action().takes_values())))
        .collect()
}

/// Split `args` (without the program name) into pipeshard's options and
/// the arguments for llama-server, each in its original order.
pub fn split_args(args: &[String]) -> (Vec<String>, Vec<String>) {
    let flags = own_flags();
    let (mut own, mut upstream) = (Vec::new(), Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let name = a.split_once('=').map_or(a.as_str(), |(n, _)| n);
        let Some(&(_, takes_value)) = flags.iter().find(|(f, _)| f == name) else {
            upstream.push(a.clone());
            continue;
        };
        own.push(a.clone());
        if takes_value && !a.contains('=') {
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

    /// Every option pipeshard defines goes to pipeshard's parser, never to
    /// llama.cpp's, in both spellings, and the help lists it.
    #[test]
    fn no_pipeshard_flag_reaches_upstream() {
        let help = help();
        let flags = own_flags();
        assert!(flags.len() >= 14, "{flags:?}");
        for (flag, takes_value) in &flags {
            assert!(help.contains(flag.as_str()), "{flag} is not in the help:\n{help}");
            let mut args = strings(&["-m", "x.gguf", flag]);
            if *takes_value {
                args.push("1".into());
            }
            let (own, up) = split_args(&args);
            assert_eq!(up, strings(&["-m", "x.gguf"]), "{flag}");
            assert_eq!(own, args[2..], "{flag}");
            let (own, up) = split_args(&strings(&[&format!("{flag}=1"), "-c", "64"]));
            assert_eq!((own.len(), up), (1, strings(&["-c", "64"])), "{flag}");
        }
        // the option the hand-kept list missed
        let (own, up) = split_args(&strings(&["--cpu-copies", "false", "-np", "2"]));
        assert_eq!(up, strings(&["-np", "2"]));
        assert!(!ServerOptions::parse(&own).unwrap().pipeshard.cpu_copies);
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

    #[test]
    fn bench_routing_is_pipeshards_option() {
        let (own, up) = split_args(&strings(&[
            "--bench-routing",
            "calibrated",
            "-np",
            "4",
            "--vram-budget=4GiB",
        ]));
        assert_eq!(own, strings(&["--bench-routing", "calibrated", "--vram-budget=4GiB"]));
        assert_eq!(up, strings(&["-np", "4"]));
        let o = ServerOptions::parse(&own).unwrap();
        assert_eq!(o.bench_routing, Some(RoutingPoint::Calibrated));
        assert!(ServerOptions::parse(&strings(&["--bench-routing", "zipf"])).is_err());
        assert!(help().contains("--bench-routing"));
    }
}
