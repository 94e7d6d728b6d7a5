//! Remote devices through llama.cpp's RPC backend (`libggml-rpc.so`, built
//! beside the other backend modules): each `host:port` names an upstream
//! `ggml-rpc-server`, whose devices join this process's device list as
//! `RPC0`, `RPC1`, ... (the names `--vram-budget` takes). llama.cpp places
//! them first in its layer order, as `llama-cli --rpc` does.

use std::ffi::{c_char, CString};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::backend::{list_devices, Device};
use super::error::{EngineError, Result};
use super::ffi;

/// How long to wait for an RPC server to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `ggml_backend_rpc_add_server`, found through the RPC registry.
type AddServerFn = unsafe extern "C" fn(*const c_char) -> ffi::ggml_backend_reg_t;

/// Register the devices of the RPC servers at `endpoints` (`host:port`,
/// as llama.cpp's `--rpc` spells them) after [`super::init`]; returns the
/// devices ggml knows then. A server that does not answer is an error here,
/// before ggml's own connection (which aborts the process on failure).
pub fn add_rpc_servers(endpoints: &[String]) -> Result<Vec<Device>> {
    for endpoint in endpoints {
        check_reachable(endpoint)?;
    }
    let add = add_server_fn()?;
    for endpoint in endpoints {
        let c = CString::new(endpoint.as_str()).map_err(|_| EngineError::NulInText)?;
        // SAFETY: c is a valid C string for the call; the server answered a
        // connection just now, so ggml's handshake meets a listener.
        let reg = unsafe { add(c.as_ptr()) };
        if reg.is_null() {
            return Err(EngineError::Rpc {
                endpoint: endpoint.clone(),
                reason: "ggml's RPC backend refused it".into(),
            });
        }
        // SAFETY: reg is the registry ggml just made for this server.
        unsafe { ffi::ggml_backend_register(reg) };
        tracing::info!("RPC server {endpoint}: devices registered");
    }
    Ok(list_devices())
}

/// The RPC backend's `add_server` entry point.
fn add_server_fn() -> Result<AddServerFn> {
    // SAFETY: registry lookups with valid C strings; the symbol, when
    // present, has the signature upstream's common/arg.cpp calls it with.
    unsafe {
        let reg = ffi::ggml_backend_reg_by_name(c"RPC".as_ptr());
        if reg.is_null() {
            return Err(EngineError::InvalidArgument(
                "--rpc: ggml's RPC backend (libggml-rpc.so) is not among the loaded backend modules".into(),
            ));
        }
        let f = ffi::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_rpc_add_server".as_ptr());
        if f.is_null() {
            return Err(EngineError::InvalidArgument(
                "--rpc: the RPC backend has no ggml_backend_rpc_add_server".into(),
            ));
        }
        Ok(std::mem::transmute::<*mut std::ffi::c_void, AddServerFn>(f))
    }
}

/// Whether `endpoint` is `host:port` and accepts a TCP connection.
fn check_reachable(endpoint: &str) -> Result<()> {
    let err = |reason: String| EngineError::Rpc {
        endpoint: endpoint.to_string(),
        reason,
    };
    let addrs: Vec<_> = endpoint
        .to_socket_addrs()
        .map_err(|e| err(format!("not a host:port ({e})")))?
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(err(last.map_or("no address".into(), |e| format!("no connection ({e})"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_or_silent_endpoint_is_an_error_not_an_abort() {
        let e = check_reachable("no-port-here").unwrap_err().to_string();
        assert!(e.contains("not a host:port"), "{e}");
        // A port nothing listens on: bind one, then free it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = check_reachable(&format!("127.0.0.1:{port}")).unwrap_err().to_string();
        assert!(e.contains("no connection"), "{e}");
    }
}
