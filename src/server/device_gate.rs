//! The vision worker borrows the device from the text slots while it encodes
//! an image. The slots' worker frees its context's compute memory, pauses,
//! and resumes when the image is encoded. The encoder's peak and the text
//! slots' compute peak then never coexist, in `serve` as in `run`.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::engine::EncodeGate;

#[derive(Debug, Default)]
struct State {
    /// The vision worker asks for the device.
    wanted: bool,
    /// The text worker has released its compute and is paused.
    lent: bool,
}

/// Shared by the text slots' worker and the vision worker.
#[derive(Debug, Default)]
pub struct DeviceGate {
    state: Mutex<State>,
    changed: Condvar,
}

impl DeviceGate {
    /// How often an idle text worker looks at the gate.
    pub const IDLE_POLL: Duration = Duration::from_millis(10);

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking holder leaves plain flags behind, which stay usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Text side, between two steps: when the vision worker wants the
    /// device, run `release` (free the compute memory), then wait until the
    /// device is given back.
    pub fn lend_if_wanted(&self, release: impl FnOnce()) {
        let mut st = self.lock();
        if !st.wanted {
            return;
        }
        release();
        st.lent = true;
        self.changed.notify_all();
        while st.wanted {
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.lent = false;
    }
}

impl EncodeGate for DeviceGate {
    /// Vision side: returns once the text worker has released its compute
    /// memory and paused.
    fn begin(&self) {
        let mut st = self.lock();
        st.wanted = true;
        self.changed.notify_all();
        while !st.lent {
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Vision side: the text worker may go on.
    fn end(&self) {
        let mut st = self.lock();
        st.wanted = false;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    /// The text worker never runs a step while an image is encoded, lends
    /// the device (releasing its compute) when asked, and goes on between
    /// images. Back-to-back images may find it still paused, which is fine:
    /// its compute is still released.
    #[test]
    fn the_text_worker_pauses_while_an_image_is_encoded() {
        let gate = Arc::new(DeviceGate::default());
        let encoding = Arc::new(AtomicBool::new(false));
        let releases = Arc::new(AtomicUsize::new(0));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let text = {
            let (gate, encoding, releases, overlaps, stop) = (
                gate.clone(),
                encoding.clone(),
                releases.clone(),
                overlaps.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    gate.lend_if_wanted(|| {
                        releases.fetch_add(1, Ordering::SeqCst);
                    });
                    // A step: it must never run during an encode.
                    if encoding.load(Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        };
        for i in 0..20 {
            gate.begin();
            encoding.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
            encoding.store(false, Ordering::SeqCst);
            gate.end();
            if i % 2 == 0 {
                // Time for the text worker to run a few steps.
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        stop.store(true, Ordering::SeqCst);
        text.join().unwrap();
        let r = releases.load(Ordering::SeqCst);
        assert!((1..=20).contains(&r), "{r} releases for 20 images");
        assert_eq!(overlaps.load(Ordering::SeqCst), 0, "a text step ran during an encode");
        assert!(!gate.lock().wanted);
    }
}
