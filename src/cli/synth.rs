//! `pipeshard synth`: random-weight GGUFs with real model shapes.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use pipeshard::progress;
use pipeshard_devtools::synth::{self, presets, Quant, SynthOptions};

#[derive(clap::Args)]
pub struct SynthArgs {
    /// Architecture preset, e.g. llama3.1-8b, qwen3-30b-a3b, tiny-llama3.1-8b.
    #[arg(long = "arch")]
    pub arch: String,
    /// q4_0, q8_0, q4_k_m, q5_k_m, q6_k, mxfp4 or f16.
    #[arg(long = "quant", default_value = "q4_0")]
    pub quant: String,
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// For vision presets: where to write the vision projector.
    #[arg(long = "mmproj-out")]
    pub mmproj_out: Option<PathBuf>,
    #[arg(long = "seed", default_value_t = 0)]
    pub seed: u64,
    /// Worker threads (0: all cores).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
}

pub fn synth_cmd(args: SynthArgs) -> Result<()> {
    let quant = Quant::from_name(&args.quant)
        .with_context(|| format!("unknown --quant {:?} (use {})", args.quant, Quant::names()))?;
    presets::by_name(&args.arch)?;
    let mut opts = SynthOptions::new(args.arch.clone(), quant, args.output.clone());
    opts.mmproj_output = args.mmproj_out.clone();
    opts.seed = args.seed;
    opts.threads = args.threads;
    let bar = progress::bytes_bar(0, &format!("synth {}", args.arch));
    let report = synth::synth(&opts, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {} ({:.2} GiB) in {:.1} s",
        args.output.display(),
        report.model.bytes as f64 / (1u64 << 30) as f64,
        report.elapsed.as_secs_f64()
    );
    if let (Some(p), Some(m)) = (&args.mmproj_out, &report.mmproj) {
        eprintln!(
            "wrote {} ({:.2} GiB)",
            p.display(),
            m.bytes as f64 / (1u64 << 30) as f64
        );
    }
    Ok(())
}
