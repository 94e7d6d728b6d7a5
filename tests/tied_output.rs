//! Tied embeddings, on the CPU: a model without `output.weight` (SmolLM2,
//! Gemma 3) runs its output projection on the token embedding, which
//! llama.cpp loads a second time for it. The planner plans that load as
//! `output.weight`, and the loader asks the placement callback for it by
//! that name (patch 0056): on the embedding's buffer type it is the one
//! tensor, on another a copy there, with the plain load's tokens either way.
//! A model with its own output is planned as before.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pipeshard::engine::{buffer_types, BufferType, Offload, OffloadQuery, OpKind, TensorPlacement};
use pipeshard::gguf::{tied_output, ModelInfo, TensorRole};
use pipeshard::plan::{self, PlanRequest};
use pipeshard::profile::MachineProfile;
use pipeshard_devtools::fuzz::mutate::RawGguf;
use pipeshard_devtools::synth::{self, Quant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn plan_at(m: &ModelInfo, budget: u64) -> plan::Plan {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu-machine-profile.yaml");
    let profile = MachineProfile::load(&fixture).expect("the fixture profile");
    plan::make_plan(m, &profile, &PlanRequest::new(budget, 4096)).unwrap_or_else(|e| panic!("{:?}: {e}", m.name))
}

/// The plan's rows of role Output.
fn outputs(p: &plan::Plan) -> Vec<&plan::PlannedTensor> {
    p.tensors.iter().filter(|t| t.role == "Output").collect()
}

#[test]
fn a_tied_model_plans_its_output_as_a_copy_of_the_embedding() {
    let smollm2 = pipeshard::gguf::inspect(&common::default_model_path()).unwrap().1;
    let gemma = synth::model_info("gemma-3-27b", Quant::Q4_K_M).unwrap();
    let tiny = synth::model_info("tiny-gemma-3-27b", Quant::Q8_0).unwrap();
    for (m, budget) in [(&smollm2, 512 * MIB), (&gemma, 8 * GIB), (&tiny, GIB)] {
        let name = &m.architecture;
        assert!(m.tied_output, "{name}");
        let embd = m.tensors.iter().find(|t| t.role == TensorRole::TokenEmbd).unwrap();
        let p = plan_at(m, budget);
        let out = outputs(&p);
        assert_eq!(out.len(), 1, "{name}: {out:?}");
        let out = out[0];
        assert_eq!(out.name, tied_output::OUTPUT, "{name}");
        assert!(out.tied, "{name}");
        assert_eq!(
            (out.bytes, out.vram_bytes),
            (embd.nbytes, embd.cuda_alloc_size()),
            "{name}"
        );
        assert!(!out.exec.is_empty(), "{name}: the output's op is priced in every tier");
        assert!(p.vram.total <= p.vram.budget, "{name}: {:?}", p.vram);
        // the file's tensors are what they were: the copy is the planner's
        assert_eq!(m.file_tensors().count() + 1, m.tensors.len(), "{name}");
    }
}

#[test]
fn a_model_with_its_own_output_plans_it_untied() {
    let m = synth::model_info("llama3.1-8b", Quant::Q4_0).unwrap();
    assert!(!m.tied_output);
    assert_eq!(m.file_tensors().count(), m.tensors.len());
    let own = m.tensors.iter().find(|t| t.role == TensorRole::Output).unwrap();
    let p = plan_at(&m, 4 * GIB);
    let out = outputs(&p);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].name.as_str(), out[0].bytes, out[0].tied),
        (own.name.as_str(), own.nbytes, false)
    );
}

/// Loads `path` on the CPU, read into memory, with each weight's buffer
/// type from `placement` (`None`: llama.cpp's choice); the names the
/// callback was asked, with how often; the model's weight bytes per buffer
/// type; and the greedy tokens.
fn load_and_decode(path: &Path, placement: Option<TensorPlacement>) -> (BTreeMap<String, u64>, Vec<i32>) {
    let model = common::load_on_cpu(path, placement);
    let (tokens, by_buffer) = common::greedy_by_buffer(&model);
    (by_buffer, tokens)
}

/// A placement that puts `output.weight` on `output` (`None`: llama.cpp's
/// choice) and every other weight on the plain CPU buffer type, counting
/// the names it is asked.
fn placement(output: Option<BufferType>, asked: Arc<Mutex<BTreeMap<String, u32>>>) -> TensorPlacement {
    let cpu = buffer_types().into_iter().find(|b| b.name() == "CPU").unwrap();
    Arc::new(move |name: &str| {
        *asked.lock().unwrap().entry(name.to_string()).or_default() += 1;
        if name == tied_output::OUTPUT {
            output
        } else {
            Some(cpu)
        }
    })
}

/// A copy of the model at `path` without its `output.weight`: one that
/// ties its output to its token embedding.
fn without_output(path: &Path) -> PathBuf {
    let mut raw = RawGguf::open(path).unwrap();
    raw.tensors.retain(|t| t.name != tied_output::OUTPUT.as_bytes());
    let tied = path.with_extension("tied.gguf");
    let mut bytes = raw.header_bytes();
    bytes.extend_from_slice(&raw.data);
    std::fs::write(&tied, bytes).unwrap();
    tied
}

#[test]
fn the_tied_output_is_placed_by_its_own_name() {
    pipeshard::engine::init(None).unwrap();
    let dir = common::scratch_dir("tied-output");
    let cpu = buffer_types().into_iter().find(|b| b.name() == "CPU").unwrap();
    // Tiny Llama 3.1 at Q4_0 without its output.weight (a Q4_0 embedding):
    // llama.cpp's own choice for the output projection is its repacked
    // layout (x86, AVX2), a buffer type other than the embedding's (a
    // lookup table, which stays in the plain CPU buffer). Tiny Gemma 3 at
    // Q4_0 (a Q6_K embedding, which it does not repack there): the output
    // on the embedding's buffer type is the embedding's tensor.
    let llama = without_output(&common::synth_tiny_model(&dir, "tiny-llama3.1-8b", Quant::Q4_0));
    let gemma = common::synth_tiny_model(&dir, "tiny-gemma-3-27b", Quant::Q4_0);
    for (path, output, output_buft, copies) in [(llama, None, "CPU_REPACK", 2), (gemma, Some(cpu), "CPU", 1)] {
        let quant = path.display();
        let (gguf, m) = pipeshard::gguf::inspect(&path).unwrap();
        let file_bytes: u64 = gguf.tensors().iter().map(|t| t.nbytes).sum();
        let embd = m.tensors.iter().find(|t| t.role == TensorRole::TokenEmbd).unwrap();
        let (embd, embd_type) = (embd.nbytes, embd.ty);
        let (_, plain) = load_and_decode(&path, None);

        let asked: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
        let (by_buffer, tokens) = load_and_decode(&path, Some(placement(output, asked.clone())));
        let asked = asked.lock().unwrap();
        assert_eq!(asked.get(tied_output::OUTPUT), Some(&1), "{quant}: asked {asked:?}");
        assert_eq!(asked.get(tied_output::EMBEDDING), Some(&1), "{quant}: asked {asked:?}");
        assert_eq!(tokens, plain, "{quant}");
        // the output in its buffer type: a copy of the embedding's bytes
        // there, or the one tensor on the embedding's buffer type
        let loaded: u64 = by_buffer.values().sum();
        assert_eq!(
            loaded,
            file_bytes + (copies - 1) * embd,
            "{quant} ({embd_type:?} embedding): {by_buffer:?}"
        );
        assert!(
            by_buffer.get(output_buft).is_some_and(|&b| b >= embd),
            "{quant}: {by_buffer:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The graph sees the tied output's matmul by the embedding's name (the
/// loaded tensor keeps it): the plan's offload and row-split decisions for
/// `output.weight` answer it, and the embedding's own lookup is left alone.
#[test]
fn the_tied_outputs_matmul_gets_the_outputs_decisions() {
    let m = synth::model_info("gemma-3-27b", Quant::Q4_K_M).unwrap();
    // a budget that keeps the 1.08 GiB output in host memory
    let mut p = plan_at(&m, 2 * GIB);
    let out = p.tensors.iter_mut().find(|t| t.tied).unwrap();
    assert!(!out.resident, "{out:?}");
    out.gpu_share = vec![(1, 0.25)];
    let exec = out.exec.clone();
    let policies = plan::apply::policies(&p);
    for (n_tokens, e) in exec {
        let query = |weight, op| OffloadQuery {
            weight,
            op,
            n_tokens: i64::from(n_tokens),
        };
        let output = (policies.offload)(&query(tied_output::OUTPUT, OpKind::MulMat));
        let want = if e == plan::Exec::Stream {
            Offload::Gpu
        } else {
            Offload::Cpu
        };
        assert_eq!(output, want, "{n_tokens} tokens: {e:?}");
        assert_eq!(
            (policies.offload)(&query(tied_output::EMBEDDING, OpKind::MulMat)),
            output
        );
        assert_eq!(
            (policies.offload)(&query(tied_output::EMBEDDING, OpKind::GetRows)),
            Offload::Default
        );
    }
    let rows = m.n_vocab.unwrap();
    let split = policies.row_split.expect("the output splits in decode");
    assert_eq!(
        split(tied_output::EMBEDDING, rows, 1),
        plan::apply::gpu_rows(rows, 0.25)
    );
    assert_eq!(
        split(tied_output::EMBEDDING, rows, 1),
        split(tied_output::OUTPUT, rows, 1)
    );
}

/// A re-plan keeps the tied output where it was loaded (no move can take it
/// elsewhere: the context knows it by the embedding's name) and counts its
/// device bytes at every budget, instead of planning it to host memory and
/// counting the device memory it still holds as free.
#[test]
fn a_replan_holds_the_tied_output_where_it_was_loaded() {
    use pipeshard::launch::live::{moves, ReplanBasis};

    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu-machine-profile.yaml");
    let profile = MachineProfile::load(&fixture).expect("the fixture profile");
    let m = synth::model_info("gemma-3-27b", Quant::Q4_K_M).unwrap();
    let req = PlanRequest::new(24 * GIB, 4352);
    let launched = plan::make_plan(&m, &profile, &req).unwrap();
    let out = launched.tensors.iter().find(|t| t.tied).expect("the tied output");
    assert!(out.resident, "at 24 GiB the tied output is resident");
    let basis = ReplanBasis::new(m, profile, req, &launched);
    for budget in [8 * GIB, 12 * GIB] {
        let r = basis.plan(budget).unwrap();
        assert!(r.fits, "{budget}");
        assert!(r.plan.vram.total <= budget, "{budget}: {}", r.plan.vram.total);
        assert!(
            r.plan.vram.reserve >= launched.vram.reserve + out.vram_bytes,
            "{budget}: the re-plan's reserve {} does not hold the tied output's {} bytes",
            r.plan.vram.reserve,
            out.vram_bytes
        );
        let m = moves::diff(&launched, &r.plan, &Default::default());
        assert!(m.iter().all(|mv| mv.tensor != tied_output::OUTPUT), "{m:?}");
    }
}
