//! Embeddings (`--embeddings`): a second engine context with embeddings on,
//! owned by its own thread. Models that pool in llama.cpp are read per
//! sequence; the others are mean-pooled over their token embeddings here.

use std::sync::mpsc::Receiver;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::worker::WorkerThread;
use crate::engine::{BatchItem, Context, ContextParams, EngineError, Model, Token};

/// One embedding request: several inputs, one vector each.
pub struct EmbedJob {
    pub inputs: Vec<Vec<Token>>,
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, String>>,
}

/// The handle requests use to reach the embedding thread.
#[derive(Clone)]
pub struct Embedder {
    worker: Arc<WorkerThread<EmbedJob>>,
    /// Longest input in tokens.
    pub n_ctx: u32,
}

impl Embedder {
    /// Start the thread and create its context.
    pub fn spawn(model: Arc<Model>, mut params: ContextParams) -> Result<Embedder, EngineError> {
        params.embeddings = true;
        params.n_seq_max = 1;
        let (worker, n_ctx) = WorkerThread::start(
            "the embedding thread",
            "pipeshard-embed",
            move |startup, rx: Receiver<EmbedJob>| {
                let Some(mut ctx) = startup.check(Context::new(&model, params)) else {
                    return;
                };
                startup.ready(ctx.n_ctx());
                while let Ok(job) = rx.recv() {
                    let out: Result<Vec<Vec<f32>>, String> = job
                        .inputs
                        .iter()
                        .map(|t| embed_one(&mut ctx, t).map_err(|e| e.to_string()))
                        .collect();
                    let _ = job.reply.send(out);
                }
            },
        )?;
        Ok(Embedder {
            worker: Arc::new(worker),
            n_ctx,
        })
    }

    /// Embed inputs (already tokenized); unnormalised vectors.
    pub async fn embed(&self, inputs: Vec<Vec<Token>>) -> Result<Vec<Vec<f32>>, String> {
        let (reply, rx) = oneshot::channel();
        self.worker
            .send(EmbedJob { inputs, reply })
            .map_err(|_| "the embedding thread has stopped".to_string())?;
        rx.await.map_err(|_| "the embedding thread has stopped".to_string())?
    }
}

fn embed_one(ctx: &mut Context<'_>, tokens: &[Token]) -> Result<Vec<f32>, EngineError> {
    if tokens.is_empty() {
        return Err(EngineError::InvalidArgument("input is empty".into()));
    }
    if tokens.len() > ctx.n_ctx() as usize {
        return Err(EngineError::ContextOverflow {
            n_tokens: tokens.len(),
            n_ctx: ctx.n_ctx(),
        });
    }
    ctx.clear();
    let n_embd = ctx.model().n_embd() as usize;
    let pooled = ctx.is_pooled();
    let chunk = ctx.n_batch() as usize;
    if pooled && tokens.len() > chunk {
        return Err(EngineError::InvalidArgument(format!(
            "input of {} tokens is larger than the batch ({chunk}); increase -b/-ub",
            tokens.len()
        )));
    }
    let mut sum = vec![0f64; n_embd];
    for (ci, part) in tokens.chunks(chunk).enumerate() {
        let base = ci * chunk;
        let items: Vec<BatchItem> = part
            .iter()
            .enumerate()
            .map(|(i, &t)| BatchItem {
                token: t,
                pos: (base + i) as i32,
                seq: 0,
                logits: true,
            })
            .collect();
        ctx.decode_batch(&items)?;
        if pooled {
            return ctx.sequence_embedding(0).ok_or(EngineError::NoEmbeddings);
        }
        for i in 0..part.len() {
            let e = ctx.output_embedding(i as i32).ok_or(EngineError::NoEmbeddings)?;
            for (s, v) in sum.iter_mut().zip(e) {
                *s += v as f64;
            }
        }
    }
    let n = tokens.len() as f64;
    Ok(sum.into_iter().map(|s| (s / n) as f32).collect())
}

/// Normalise as upstream's `common_embd_normalize`: -1 none, 0 max-abs
/// scaled to int16 range, 1 taxicab, 2 euclidean, >2 p-norm.
pub fn normalize(v: &mut [f32], mode: i32) {
    let norm: f64 = match mode {
        m if m < 0 => return,
        0 => v.iter().fold(0f64, |a, &x| a.max(x.abs() as f64)) / 32760.0,
        1 => v.iter().map(|&x| x.abs() as f64).sum(),
        2 => v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt(),
        p => v
            .iter()
            .map(|&x| (x.abs() as f64).powi(p))
            .sum::<f64>()
            .powf(1.0 / p as f64),
    };
    let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    for x in v {
        *x = (*x as f64 * inv) as f32;
    }
}
