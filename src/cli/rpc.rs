//! `--rpc`: remote devices through upstream's `ggml-rpc-server`, as
//! llama.cpp's tools take them.

use anyhow::Result;
use pipeshard::engine;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct RpcArgs {
    /// Remote devices: comma-separated `host:port` of upstream's
    /// `ggml-rpc-server` (llama.cpp's --rpc); they join the devices as
    /// RPC0, RPC1, ..., the names --vram-budget takes.
    #[arg(long = "rpc", env = "LLAMA_ARG_RPC", value_delimiter = ',')]
    pub rpc: Vec<String>,
}

impl RpcArgs {
    /// Register the remote devices, after `engine::init`.
    pub fn connect(&self) -> Result<()> {
        if !self.rpc.is_empty() {
            engine::add_rpc_servers(&self.rpc)?;
        }
        Ok(())
    }
}
