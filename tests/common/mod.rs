//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use pipeshard::engine::{Model, ModelParams};

/// The real default model (SmolLM2-135M-Instruct), fetched once.
pub fn default_model_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| pipeshard::default_model::ensure().expect("fetching the default model"))
        .clone()
}

/// The default model, loaded on the CPU.
pub fn load_default_model() -> Model {
    pipeshard::engine::init(None).expect("llama.cpp init");
    Model::load(
        &default_model_path(),
        ModelParams {
            n_gpu_layers: 0,
            ..Default::default()
        },
    )
    .expect("loading the default model")
}

/// A scratch directory unique to one test.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pipeshard-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a scratch dir");
    dir
}
