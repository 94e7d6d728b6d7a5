//! `pipeshard serve`: the same server as `pipeshard-server`, llama.cpp's
//! own, with pipeshard's plan installed at model load.

use std::process::ExitCode;

use super::GlobalArgs;

/// Everything after `serve` is `pipeshard-server`'s command line.
#[derive(clap::Args)]
#[command(disable_help_flag = true)]
pub struct ServeArgs {
    /// llama-server flags (`-m`, `-c`, `-np`, `--port`, ...) and pipeshard's
    /// (`--vram-budget`, `--plan`, ...); `--help` lists them.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<String>,
}

pub fn run(global: &GlobalArgs, args: ServeArgs) -> ExitCode {
    let mut argv = args.args;
    if let Some(dir) = &global.backend_dir {
        if !argv
            .iter()
            .any(|a| a == "--backend-dir" || a.starts_with("--backend-dir="))
        {
            argv.push("--backend-dir".into());
            argv.push(dir.display().to_string());
        }
    }
    pipeshard::server_hook::main_with_args("pipeshard serve", &argv)
}
