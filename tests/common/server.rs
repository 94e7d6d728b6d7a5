//! A `pipeshard-server` process for the HTTP tests, killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running server, killed on drop.
pub struct Server {
    pub child: Child,
    pub base: String,
    /// The server's stdout and stderr.
    pub log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nothing listens on.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    /// Start `cmd`, which already listens on 127.0.0.1:`port`, with its output in `log`.
    pub fn start(mut cmd: Command, port: u16, log: PathBuf) -> Server {
        let file = std::fs::File::create(&log).unwrap();
        cmd.stdin(Stdio::null()).stdout(file.try_clone().unwrap()).stderr(file);
        Server {
            child: cmd.spawn().expect("spawning pipeshard-server"),
            base: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    /// Wait (at most 60 s) until `/health` answers 200 and return its body;
    /// every other answer while loading goes to `not_ready`. Panics with the
    /// server's log if it exits.
    pub fn wait_healthy(&mut self, mut not_ready: impl FnMut(ureq::Error)) -> Value {
        let t0 = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "server exited with {status}:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            match ureq::get(&self.url("/health")).timeout(Duration::from_secs(2)).call() {
                Ok(r) => return serde_json::from_str(&r.into_string().unwrap()).unwrap(),
                Err(e) => not_ready(e),
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "server not healthy after 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}
