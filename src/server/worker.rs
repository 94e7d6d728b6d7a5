//! A worker thread fed by a channel, joined when its handle drops.
//!
//! The slots, the vision worker and the embedder each own contexts and a
//! share of the model. Joining them on drop frees those while the process
//! is still running: a context freed by a detached thread after `main`
//! returns meets a CUDA driver that is shutting down, and ggml aborts.

use std::sync::mpsc::{Receiver, SendError, Sender};
use std::thread::JoinHandle;

/// The sending end of a worker's queue and the worker itself.
pub struct WorkerThread<T> {
    tx: Option<Sender<T>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> WorkerThread<T> {
    /// Start `work` on a thread named `name`; it gets the queue's receiving
    /// end and should return once the queue is closed.
    pub fn spawn(name: &str, work: impl FnOnce(Receiver<T>) + Send + 'static) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || work(rx))?;
        Ok(WorkerThread {
            tx: Some(tx),
            thread: Some(thread),
        })
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
}
