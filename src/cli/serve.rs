//! `pipeshard serve`: llama-server's command line, served by `pipeshard::server`.

use anyhow::Result;

use super::GlobalArgs;

/// Everything after `serve` is handed to the llama-server argument parser.
#[derive(clap::Args)]
#[command(disable_help_flag = true)]
pub struct ServeArgs {
    /// llama-server flags (`-m`, `-c`, `-np`, `--port`, ...); `--help` lists them.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<String>,
}

pub fn run(global: &GlobalArgs, args: ServeArgs) -> Result<()> {
    let mut argv = args.args;
    if let Some(dir) = &global.backend_dir {
        if !argv.iter().any(|a| a == "--backend-dir") {
            argv.push("--backend-dir".into());
            argv.push(dir.display().to_string());
        }
    }
    pipeshard::server::main_with_args(&argv)?;
    Ok(())
}
