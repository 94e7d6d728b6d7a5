//! Slots and continuous batching. One worker thread owns the model's single
//! engine [`Context`] (with `n_seq_max = n_parallel`); each slot is one
//! sequence id. Every iteration gathers the next token of every generating
//! slot and prompt chunks of the others into one `decode_batch`, then samples
//! each slot from its own output index. Requests arrive over a channel;
//! results go back over per-request channels, and a closed channel frees
//! the slot at once.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::engine::{BatchItem, Context, ContextParams, EngineError, Model, Sampler, Token};
use crate::generate::{find_stop, Utf8Stream};

use super::device_gate::DeviceGate;
use super::error::ApiError;
use super::metrics::Metrics;
use super::task::{Event, Final, GenJob, GenParams, StopType, TokenLogprob, TokenProbs};
use super::worker::WorkerThread;
use crate::plan::StreamedPerTier;

/// A job with its sampler, built on the request's thread so that bad
/// sampling parameters (e.g. a grammar that does not parse) fail there.
pub struct Submission {
    pub job: GenJob,
    pub sampler: Sampler,
}

/// What `/slots` shows about a slot.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlotView {
    pub id: usize,
    pub id_task: i64,
    pub n_ctx: u32,
    pub speculative: bool,
    pub is_processing: bool,
    /// Tokens of this slot held in the KV cache.
    pub n_past: usize,
    pub n_decoded: usize,
}

/// The handle requests use to reach the worker.
#[derive(Clone)]
pub struct SchedulerHandle {
    worker: Arc<WorkerThread<Submission>>,
    /// Context per slot.
    pub n_ctx_slot: u32,
    /// Context over all slots.
    pub n_ctx: u32,
    pub n_parallel: u32,
    pub slots: Arc<Mutex<Vec<SlotView>>>,
}

impl SchedulerHandle {
    /// Queue a job; fails only when the worker is gone.
    pub fn submit(&self, s: Submission) -> Result<(), String> {
        self.worker
            .send(s)
            .map_err(|_| "the inference worker has stopped".to_string())
    }
}

/// Start the worker: it creates the context and reports how that went.
/// `streamed` (when the context applies a plan) feeds the streaming metrics;
/// with a `gate`, the worker lends the device to the vision worker.
pub fn spawn(
    model: Arc<Model>,
    params: ContextParams,
    streamed: Option<StreamedPerTier>,
    gate: Option<Arc<DeviceGate>>,
    metrics: Arc<Metrics>,
) -> Result<(SchedulerHandle, Vec<crate::engine::MemoryBreakdown>), EngineError> {
    let n_parallel = params.n_seq_max;
    let slots = Arc::new(Mutex::new(Vec::new()));
    let slots_w = slots.clone();
    let (worker, (n_ctx, mem)) = WorkerThread::start(
        "the worker thread",
        "pipeshard-slots",
        move |startup, rx: Receiver<Submission>| {
            let Some(ctx) = startup.check(Context::new(&model, params)) else {
                return;
            };
            startup.ready((ctx.n_ctx(), ctx.memory_breakdown()));
            Worker::new(&model, ctx, n_parallel as usize, metrics, slots_w, streamed, gate).run(rx);
        },
    )?;
    let handle = SchedulerHandle {
        worker: Arc::new(worker),
        n_ctx_slot: n_ctx / n_parallel.max(1),
        n_ctx,
        n_parallel,
        slots,
    };
    Ok((handle, mem))
}

struct Active {
    task: i64,
    prompt: Vec<Token>,
    params: GenParams,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
    sampler: Sampler,
    /// Next prompt index to decode.
    next_prompt: usize,
    /// Sampled token not yet decoded.
    pending: Option<Token>,
    /// Batch output index of this slot in the current batch.
    batch_idx: Option<i32>,
    n_cached: usize,
    n_decoded: usize,
    text: String,
    sent: usize,
    utf8: Utf8Stream,
    new_tokens: Vec<Token>,
    new_probs: Vec<TokenProbs>,
    t_start: Instant,
    t_gen: Option<Instant>,
    prompt_ms: f64,
}

struct Slot {
    id: usize,
    /// Tokens of this sequence in the KV cache, in position order.
    cache: Vec<Token>,
    job: Option<Active>,
    last_used: u64,
}

struct Worker<'m> {
    model: &'m Model,
    ctx: Context<'m>,
    slots: Vec<Slot>,
    n_ctx_slot: usize,
    metrics: Arc<Metrics>,
    view: Arc<Mutex<Vec<SlotView>>>,
    tick: u64,
    next_task: i64,
    streamed: Option<StreamedPerTier>,
    gate: Option<Arc<DeviceGate>>,
}

fn common_prefix(a: &[Token], b: &[Token]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Length of the longest suffix of `text` that is a proper prefix of a stop
/// string (text that must be held back while streaming).
fn partial_stop_len(text: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for s in stops.iter().filter(|s| !s.is_empty()) {
        for (i, _) in s.char_indices().skip(1) {
            if i > best && text.ends_with(&s[..i]) {
                best = i;
            }
        }
    }
    best
}

/// Softmax log-probabilities of `chosen` and the `n` most likely tokens.
fn token_probs(model: &Model, logits: &[f32], chosen: Token, n: usize, special: bool) -> TokenProbs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let lp = |t: Token| {
        logits
            .get(t as usize)
            .map_or(f32::NEG_INFINITY, |&l| (l as f64 - log_z) as f32)
    };
    let entry = |t: Token| {
        let bytes = model.token_to_bytes(t, special).unwrap_or_default();
        TokenLogprob {
            id: t,
            token: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
            logprob: lp(t),
        }
    };
    let mut top = Vec::new();
    if n > 0 {
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        let n = n.min(idx.len());
        idx.select_nth_unstable_by(n - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        idx.truncate(n);
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        top = idx.into_iter().map(|i| entry(i as Token)).collect();
    }
    TokenProbs {
        chosen: entry(chosen),
        top,
    }
}

impl<'m> Worker<'m> {
    fn new(
        model: &'m Model,
        ctx: Context<'m>,
        n: usize,
        metrics: Arc<Metrics>,
        view: Arc<Mutex<Vec<SlotView>>>,
        streamed: Option<StreamedPerTier>,
        gate: Option<Arc<DeviceGate>>,
    ) -> Self {
        let n_ctx_slot = (ctx.n_ctx() as usize / n.max(1)).max(1);
        let slots = (0..n)
            .map(|id| Slot {
                id,
                cache: Vec::new(),
                job: None,
                last_used: 0,
            })
            .collect();
        let w = Worker {
            model,
            ctx,
            slots,
            n_ctx_slot,
            metrics,
            view,
            tick: 0,
            next_task: 0,
            streamed,
            gate,
        };
        w.publish();
        w
    }

    fn publish(&self) {
        let v: Vec<SlotView> = self
            .slots
            .iter()
            .map(|s| SlotView {
                id: s.id,
                id_task: s.job.as_ref().map_or(-1, |j| j.task),
                n_ctx: self.n_ctx_slot as u32,
                speculative: false,
                is_processing: s.job.is_some(),
                n_past: s.cache.len(),
                n_decoded: s.job.as_ref().map_or(0, |j| j.n_decoded),
            })
            .collect();
        if let Ok(mut g) = self.view.lock() {
            *g = v;
        }
        let busy = self.slots.iter().filter(|s| s.job.is_some()).count();
        self.metrics.requests_processing.store(busy as u64, Relaxed);
    }

    fn run(mut self, rx: Receiver<Submission>) {
        let mut queue: VecDeque<Submission> = VecDeque::new();
        loop {
            // The vision worker may borrow the device between two steps.
            if let Some(gate) = &self.gate {
                let ctx = &mut self.ctx;
                gate.lend_if_wanted(|| ctx.release_compute());
            }
            let busy = self.slots.iter().any(|s| s.job.is_some());
            if !busy && queue.is_empty() {
                let next = match self.gate {
                    // Idle with a vision worker: wake now and then to lend the device.
                    Some(_) => rx.recv_timeout(DeviceGate::IDLE_POLL),
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                };
                match next {
                    Ok(s) => queue.push_back(s),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            while let Ok(s) = rx.try_recv() {
                queue.push_back(s);
            }
            // Clients that went away free their slot (or queue place) now.
            for i in 0..self.slots.len() {
                if self.slots[i].job.as_ref().is_some_and(|j| j.events.is_closed()) {
                    tracing::debug!(slot = i, "client disconnected, slot released");
                    self.slots[i].job = None;
                }
            }
            queue.retain(|s| !s.job.events.is_closed());
            while let Some(front) = queue.front() {
                let Some(i) = self.pick_slot(&front.job) else {
                    break;
                };
                if let Some(sub) = queue.pop_front() {
                    self.start(i, sub);
                }
            }
            self.metrics.requests_deferred.store(queue.len() as u64, Relaxed);
            self.publish();
            self.step();
            self.publish();
        }
    }

    fn pick_slot(&self, job: &GenJob) -> Option<usize> {
        if job.params.id_slot >= 0 {
            let i = job.params.id_slot as usize;
            return self.slots.get(i).filter(|s| s.job.is_none()).map(|s| s.id);
        }
        let idle = self.slots.iter().filter(|s| s.job.is_none());
        if job.params.cache_prompt {
            idle.max_by_key(|s| (common_prefix(&s.cache, &job.prompt), std::cmp::Reverse(s.last_used)))
                .map(|s| s.id)
        } else {
            idle.min_by_key(|s| s.last_used).map(|s| s.id)
        }
    }

    fn start(&mut self, i: usize, sub: Submission) {
        let Submission { job, mut sampler } = sub;
        self.tick += 1;
        self.next_task += 1;
        let seq = i as i32;
        let slot = &mut self.slots[i];
        slot.last_used = self.tick;
        let mut keep = if job.params.cache_prompt {
            common_prefix(&slot.cache, &job.prompt)
        } else {
            0
        };
        // The last prompt token is always decoded again, for its logits.
        if keep >= job.prompt.len() {
            keep = job.prompt.len().saturating_sub(1);
        }
        if !self.ctx.seq_rm(seq, keep as i32, -1) {
            self.ctx.seq_rm(seq, 0, -1);
            keep = 0;
        }
        slot.cache.truncate(keep);
        // Prompt tokens feed the penalties' history, but must not reach a
        // grammar (it constrains only the output).
        if job.params.sampling.grammar.is_none() {
            for &t in &job.prompt {
                sampler.accept(t);
            }
        }
        let active = Active {
            task: self.next_task,
            prompt: job.prompt,
            params: job.params,
            events: job.events,
            sampler,
            next_prompt: keep,
            pending: None,
            batch_idx: None,
            n_cached: keep,
            n_decoded: 0,
            text: String::new(),
            sent: 0,
            utf8: Utf8Stream::default(),
            new_tokens: Vec::new(),
            new_probs: Vec::new(),
            t_start: Instant::now(),
            t_gen: None,
            prompt_ms: 0.0,
        };
        let zero = active.params.n_predict == 0;
        slot.job = Some(active);
        if zero {
            self.finish(i, StopType::Limit, String::new());
        }
    }

    /// One batch over all active slots.
    fn step(&mut self) {
        let n_batch = self.ctx.n_batch() as usize;
        let mut items: Vec<BatchItem> = Vec::new();
        let mut in_batch: Vec<usize> = Vec::new();
        // Generating slots first: one token each.
        for s in &mut self.slots {
            let Some(job) = s.job.as_mut() else { continue };
            job.batch_idx = None;
            if let Some(t) = job.pending.take() {
                if items.len() >= n_batch {
                    job.pending = Some(t);
                    continue;
                }
                job.batch_idx = Some(items.len() as i32);
                items.push(BatchItem {
                    token: t,
                    pos: s.cache.len() as i32,
                    seq: s.id as i32,
                    logits: true,
                });
                s.cache.push(t);
                in_batch.push(s.id);
            }
        }
        // Then prompt chunks, as much as the batch holds.
        for s in &mut self.slots {
            let Some(job) = s.job.as_mut() else { continue };
            if job.next_prompt >= job.prompt.len() || job.batch_idx.is_some() {
                continue;
            }
            let room = n_batch - items.len().min(n_batch);
            if room == 0 {
                break;
            }
            let end = (job.next_prompt + room).min(job.prompt.len());
            for p in job.next_prompt..end {
                let last = p + 1 == job.prompt.len();
                if last {
                    job.batch_idx = Some(items.len() as i32);
                }
                items.push(BatchItem {
                    token: job.prompt[p],
                    pos: p as i32,
                    seq: s.id as i32,
                    logits: last,
                });
            }
            s.cache.extend_from_slice(&job.prompt[job.next_prompt..end]);
            job.next_prompt = end;
            in_batch.push(s.id);
        }
        if items.is_empty() {
            return;
        }
        let busy = self.slots.iter().filter(|s| s.job.is_some()).count();
        self.metrics.n_decode_total.fetch_add(1, Relaxed);
        self.metrics.n_busy_slots_total.fetch_add(busy as u64, Relaxed);
        if let Err(e) = self.ctx.decode_batch(&items) {
            tracing::warn!("decode failed: {e}");
            for &i in &in_batch {
                self.ctx.seq_rm(i as i32, 0, -1);
                self.slots[i].cache.clear();
                if let Some(job) = self.slots[i].job.take() {
                    let _ = job
                        .events
                        .send(Event::Error(ApiError::internal(format!("decoding failed: {e}"))));
                }
            }
            return;
        }
        let max_pos = self.slots.iter().map(|s| s.cache.len()).max().unwrap_or(0) as u64;
        self.metrics.n_tokens_max.fetch_max(max_pos, Relaxed);
        self.metrics.record_batch(self.streamed.as_ref(), items.len());
        for i in in_batch {
            let Some(idx) = self.slots[i].job.as_ref().and_then(|j| j.batch_idx) else {
                continue;
            };
            self.sample(i, idx);
        }
    }

    fn sample(&mut self, i: usize, idx: i32) {
        let model = self.model;
        let Some(job) = self.slots[i].job.as_mut() else {
            return;
        };
        if job.t_gen.is_none() {
            job.prompt_ms = job.t_start.elapsed().as_secs_f64() * 1e3;
            job.t_gen = Some(Instant::now());
        }
        let want_probs = job.params.n_probs > 0 || job.params.want_logprobs;
        let logits = if want_probs {
            self.ctx.logits(idx).ok().map(<[f32]>::to_vec)
        } else {
            None
        };
        let tok = job.sampler.sample(&mut self.ctx, idx);
        if !job.params.ignore_eos && model.is_eog(tok) {
            self.finish(i, StopType::Eos, String::new());
            return;
        }
        job.n_decoded += 1;
        if let Some(l) = logits {
            job.new_probs
                .push(token_probs(model, &l, tok, job.params.n_probs, job.params.special));
        }
        job.new_tokens.push(tok);
        let bytes = model.token_to_bytes(tok, job.params.special).unwrap_or_default();
        let piece = job.utf8.push(&bytes);
        let search_from = job.sent;
        job.text.push_str(&piece);
        let max_stop = job.params.stop.iter().map(String::len).max().unwrap_or(0);
        let mut from = search_from.saturating_sub(max_stop);
        while !job.text.is_char_boundary(from) {
            from -= 1;
        }
        if let Some(cut) = find_stop(&job.text[from..], &job.params.stop) {
            let cut = from + cut;
            let word = job
                .params
                .stop
                .iter()
                .filter(|s| !s.is_empty())
                .find(|s| job.text[cut..].starts_with(s.as_str()))
                .cloned()
                .unwrap_or_default();
            job.text.truncate(cut);
            job.sent = job.sent.min(cut);
            self.finish(i, StopType::Word, word);
            return;
        }
        let n_past = self.slots[i].cache.len();
        let Some(job) = self.slots[i].job.as_mut() else {
            return;
        };
        let limit = job.params.n_predict >= 0 && job.n_decoded >= job.params.n_predict as usize;
        if limit || n_past + 1 >= self.n_ctx_slot {
            self.finish(i, StopType::Limit, String::new());
            return;
        }
        let safe = job.text.len() - partial_stop_len(&job.text, &job.params.stop);
        if !self.flush(i, safe) {
            return;
        }
        if let Some(job) = self.slots[i].job.as_mut() {
            job.pending = Some(tok);
        }
    }

    /// Send text up to byte `upto` plus new tokens/probabilities; false (and
    /// the slot freed) when the client is gone.
    fn flush(&mut self, i: usize, upto: usize) -> bool {
        let Some(job) = self.slots[i].job.as_mut() else {
            return false;
        };
        let upto = upto.max(job.sent);
        if upto == job.sent && job.new_probs.is_empty() && job.new_tokens.is_empty() {
            return true;
        }
        let text = job.text[job.sent..upto].to_string();
        if text.is_empty() && job.new_probs.is_empty() {
            // Nothing a client can see yet; keep the tokens for the next chunk.
            return true;
        }
        job.sent = upto;
        let ev = Event::Chunk {
            text,
            tokens: std::mem::take(&mut job.new_tokens),
            probs: std::mem::take(&mut job.new_probs),
        };
        if job.events.send(ev).is_err() {
            self.slots[i].job = None;
            return false;
        }
        true
    }

    fn finish(&mut self, i: usize, stop: StopType, word: String) {
        if let Some(job) = self.slots[i].job.as_mut() {
            if stop != StopType::Word {
                let rest = job.utf8.finish();
                job.text.push_str(&rest);
            }
        }
        let end = self.slots[i].job.as_ref().map_or(0, |j| j.text.len());
        self.flush(i, end);
        let Some(job) = self.slots[i].job.take() else {
            return;
        };
        let predicted_ms = job.t_gen.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        let fin = Final {
            id_slot: i,
            stop_type: stop,
            stopping_word: word,
            n_prompt: job.prompt.len(),
            n_cached: job.n_cached,
            n_predicted: job.n_decoded,
            prompt_ms: job.prompt_ms,
            predicted_ms,
        };
        self.metrics.record(
            (fin.n_prompt - fin.n_cached) as u64,
            fin.prompt_ms,
            fin.n_predicted as u64,
            predicted_ms,
        );
        // The slot shows idle before the client hears it is done.
        self.publish();
        let _ = job.events.send(Event::Done(fin));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_stops_are_held_back() {
        let stops = vec!["</end>".to_string()];
        assert_eq!(partial_stop_len("hello </e", &stops), 3);
        assert_eq!(partial_stop_len("hello", &stops), 0);
        assert_eq!(partial_stop_len("x<", &stops), 1);
    }
}
