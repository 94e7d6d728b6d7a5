//! Chat through the model's own template, then embed two sentences and
//! compare them.
//!
//! ```sh
//! ./dev cargo run --release --example chat_and_embed
//! ```

use pipeshard::engine::{apply_chat_template, ChatMessage, Context, ContextParams, Model, ModelParams, SamplingParams};
use pipeshard::generate::{generate, GenerateRequest};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = pipeshard::default_model::ensure()?;
    let model = Model::load(&path, ModelParams::default())?;

    let template = model.chat_template(None).ok_or("the model has no chat template")?;
    let messages = [ChatMessage {
        role: "user".into(),
        content: "Name a primary color.".into(),
    }];
    let prompt = apply_chat_template(&template, &messages, true)?;
    let mut ctx = Context::new(&model, ContextParams::default())?;
    let req = GenerateRequest::new(model.tokenize(&prompt, false, true)?, 32, SamplingParams::greedy());
    println!("assistant: {}", generate(&mut ctx, &req, |_| true)?.text);

    let embed = |text: &str| -> Result<Vec<f32>, Box<dyn std::error::Error>> {
        let mut ctx = Context::new(
            &model,
            ContextParams {
                embeddings: true,
                ..Default::default()
            },
        )?;
        ctx.decode_tokens(&model.tokenize(text, true, false)?, 0, true)?;
        Ok(ctx.embeddings(0)?)
    };
    let (a, b) = (embed("I like cats.")?, embed("I love kittens.")?);
    let dot: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    println!("cosine similarity: {:.3}", dot / (norm(&a) * norm(&b)));
    Ok(())
}
