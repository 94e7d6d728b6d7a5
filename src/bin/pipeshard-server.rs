//! `pipeshard-server`: llama.cpp's own server, llama-server, with
//! pipeshard's plan installed at model load. It takes llama-server's flags
//! and `LLAMA_ARG_*` variables, plus pipeshard's options (`--vram-budget`,
//! `--plan`, ...); see `pipeshard::server_hook`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args();
    let program = args.next().unwrap_or_else(|| "pipeshard-server".into());
    let args: Vec<String> = args.collect();
    pipeshard::server_hook::main_with_args(&program, &args)
}
