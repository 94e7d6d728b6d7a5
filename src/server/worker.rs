//! A worker thread fed by a channel, joined when its handle drops.
//!
//! The slots, the vision worker and the embedder each own contexts and a
//! share of the model. Joining them on drop frees those while the process
//! is still running: a context freed by a detached thread after `main`
//! returns meets a CUDA driver that is shutting down, and ggml aborts.

use std::sync::mpsc::{Receiver, SendError, Sender};
use std::thread::JoinHandle;

use crate::engine::EngineError;

/// A starting worker's report of its setup (its context, say), sent once:
/// [`Startup::check`] reports a failed step, [`Startup::ready`] success.
pub struct Startup<R>(Sender<Result<R, EngineError>>);

impl<R> Startup<R> {
    /// The value of a setup step, or None after reporting its error.
    pub fn check<V>(&self, step: Result<V, EngineError>) -> Option<V> {
        step.map_err(|e| {
            let _ = self.0.send(Err(e));
        })
        .ok()
    }

    /// Setup went well; `report` goes back to [`WorkerThread::start`].
    pub fn ready(self, report: R) {
        let _ = self.0.send(Ok(report));
    }
}

/// The sending end of a worker's queue and the worker itself.
pub struct WorkerThread<T> {
    tx: Option<Sender<T>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> WorkerThread<T> {
    /// Start `work` on a thread named `name`; it gets the queue's receiving
    /// end and should return once the queue is closed.
    fn spawn(name: &str, work: impl FnOnce(Receiver<T>) + Send + 'static) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || work(rx))?;
        Ok(WorkerThread {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Start `work` on a thread named `name` and wait until it reports its
    /// setup through the [`Startup`] it gets; `what` names the worker in
    /// errors. Returns the worker and its report, or the setup's error.
    pub fn start<R: Send + 'static>(
        what: &str,
        name: &str,
        work: impl FnOnce(Startup<R>, Receiver<T>) + Send + 'static,
    ) -> Result<(Self, R), EngineError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let worker = Self::spawn(name, move |rx| work(Startup(ready_tx), rx))
            .map_err(|e| EngineError::InvalidArgument(format!("cannot start {what}: {e}")))?;
        let report = ready_rx
            .recv()
            .map_err(|_| EngineError::InvalidArgument(format!("{what} stopped before it was ready")))??;
        Ok((worker, report))
    }

    /// Queue a job; fails only when the worker is gone.
    pub fn send(&self, job: T) -> Result<(), SendError<T>> {
        match &self.tx {
            Some(tx) => tx.send(job),
            None => Err(SendError(job)),
        }
    }
}

impl<T> Drop for WorkerThread<T> {
    /// Close the queue, then wait for the worker to finish what it holds.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn drop_closes_the_queue_and_waits_for_the_worker() {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        let w = WorkerThread::spawn("test-worker", move |rx: Receiver<u32>| {
            let mut sum = 0;
            while let Ok(n) = rx.recv() {
                std::thread::sleep(std::time::Duration::from_millis(5));
                sum += n;
            }
            d.store(sum as usize + 1, Ordering::SeqCst);
        })
        .unwrap();
        for n in 1..=4 {
            w.send(n).unwrap();
        }
        drop(w);
        // Every queued job ran and the thread ended before drop returned.
        assert_eq!(done.load(Ordering::SeqCst), 11);
    }

    #[test]
    fn start_returns_the_report_or_the_setup_error() {
        let (w, report) = WorkerThread::<u32>::start("a test worker", "test-ok", |startup, rx| {
            let Some(n) = startup.check(Ok::<u32, EngineError>(7)) else {
                return;
            };
            startup.ready(n * 2);
            while rx.recv().is_ok() {}
        })
        .unwrap();
        assert_eq!(report, 14);
        drop(w);
        let failed = WorkerThread::<u32>::start("a test worker", "test-err", |startup: Startup<u32>, _rx| {
            let _ = startup.check(Err::<(), _>(EngineError::InvalidArgument("no context".into())));
        });
        assert!(matches!(failed, Err(EngineError::InvalidArgument(m)) if m == "no context"));
    }
}
