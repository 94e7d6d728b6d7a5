//! Load a model, generate greedily, and stream the text.
//!
//! ```sh
//! ./dev cargo run --release --example generate -- [MODEL.gguf] ["prompt"]
//! ```
//! Without a model argument the default model is fetched (once) and used.

use std::io::Write;

use pipeshard::engine::{Context, ContextParams, Model, ModelParams, SamplingParams};
use pipeshard::generate::{generate, GenerateRequest};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = match args.next() {
        Some(p) => p.into(),
        None => pipeshard::default_model::ensure()?,
    };
    let prompt = args.next().unwrap_or_else(|| "The three laws of robotics are".into());

    let model = Model::load(&path, ModelParams::default())?;
    let mut ctx = Context::new(&model, ContextParams::default())?;
    let req = GenerateRequest::new(model.tokenize(&prompt, true, false)?, 64, SamplingParams::greedy());
    let out = generate(&mut ctx, &req, |piece| {
        print!("{piece}");
        std::io::stdout().flush().is_ok()
    })?;
    println!();
    eprintln!(
        "TTFT {:.1} ms, decode {:.1} tok/s",
        out.stats.ttft_ms, out.stats.decode_tokens_per_s
    );
    Ok(())
}
