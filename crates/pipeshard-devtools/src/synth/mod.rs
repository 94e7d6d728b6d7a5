//! Random-weight GGUF models with real architectures and shapes.
//!
//! [`synth`] writes a model that llama.cpp loads and runs — real tensor
//! names, shapes, metadata and a working byte-level BPE tokenizer — filled
//! with valid random quantized blocks instead of trained weights. It is
//! meant for testing memory planning and throughput at full scale without
//! downloading tens of gigabytes.
//!
//! Data is generated in parallel, in chunks of a few MiB, by a pool of
//! worker threads, and streamed to disk in order through [`GgufWriter`];
//! at most a bounded number of chunks is in memory at any time. Output is
//! deterministic for a given seed, whatever the thread count.

mod families;
pub mod presets;
pub mod quantize;
pub mod rng;
pub mod tokenizer;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::gguf::writer::FILE_BUFFER_BYTES;
use crate::gguf::{GgmlType, GgufValue, GgufWriteError, GgufWriter};

pub use presets::{by_name, ArchPreset, Family, GatedDeltaNet, Gemma4, Mla, TensorSpec, UnknownPreset, VisionPreset};
pub use quantize::{Init, MixContext, Quant};
pub use tokenizer::TokenizerError;

/// What `general.name` of a synthetic model starts with, before the preset's name.
pub const NAME_PREFIX: &str = "pipeshard synthetic ";

use rng::WyRand;

/// Target size of one generated chunk.
const CHUNK_BYTES: u64 = 4 << 20;

/// What to generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthOptions {
    /// Preset name (see [`presets::names`]).
    pub preset: String,
    /// Quantization scheme.
    pub quant: Quant,
    /// Where to write the language model.
    pub output: PathBuf,
    /// Where to write the vision projector (mmproj), for presets with a
    /// vision tower. It is always F16, as upstream converts it.
    pub mmproj_output: Option<PathBuf>,
    /// Seed of the random weights.
    pub seed: u64,
    /// Worker threads; 0 means all available cores.
    pub threads: usize,
}

impl SynthOptions {
    /// Options with seed 0 and all cores.
    pub fn new(preset: impl Into<String>, quant: Quant, output: impl Into<PathBuf>) -> Self {
        SynthOptions {
            preset: preset.into(),
            quant,
            output: output.into(),
            mmproj_output: None,
            seed: 0,
            threads: 0,
        }
    }
}

/// One written file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileReport {
    /// Its path.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Number of tensors.
    pub n_tensors: usize,
    /// Number of parameters.
    pub n_params: u64,
    /// Number of tensors of each type.
    pub type_counts: BTreeMap<GgmlType, usize>,
}

/// What [`synth`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthReport {
    /// The preset used.
    pub preset: String,
    /// The scheme used.
    pub quant: Quant,
    /// The language model file.
    pub model: FileReport,
    /// The vision projector file, if one was requested.
    pub mmproj: Option<FileReport>,
    /// Wall time.
    pub elapsed: Duration,
}

/// Why synthesis failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SynthError {
    /// The preset name is unknown.
    #[error(transparent)]
    UnknownPreset(#[from] UnknownPreset),
    /// An mmproj was requested for a preset without a vision tower.
    #[error("preset '{0}' has no vision tower, so it has no mmproj to write")]
    NoVisionTower(String),
    /// The tokenizer could not be built.
    #[error("preset '{preset}': {source}")]
    Tokenizer {
        /// The preset.
        preset: String,
        /// Why.
        source: TokenizerError,
    },
    /// A tensor would get a type synth cannot generate.
    #[error("tensor '{tensor}' would be {ty}, which synth cannot generate")]
    UnsupportedType {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
    },
    /// The GGUF writer rejected the model or failed to write.
    #[error("{}: {source}", path.display())]
    Write {
        /// The file being written.
        path: PathBuf,
        /// Why.
        source: GgufWriteError,
    },
    /// A filesystem operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A tensor with its chosen type, ready to generate.
#[derive(Debug, Clone)]
struct Planned {
    spec: TensorSpec,
    ty: GgmlType,
}

/// Chooses the type of every tensor of the language model.
fn plan_model(preset: &ArchPreset, quant: Quant) -> Vec<Planned> {
    let ctx = MixContext {
        n_layer: preset.n_layer,
        n_expert: preset.n_expert,
        has_output: !preset.tied_embeddings,
    };
    preset
        .tensors()
        .into_iter()
        .map(|spec| Planned {
            ty: quantize::tensor_type(quant, &spec.name, &spec.dims, &ctx),
            spec,
        })
        .collect()
}

/// The mmproj is F16 with F32 norms and biases, as `convert_hf_to_gguf.py`
/// writes it.
fn plan_mmproj(vision: &VisionPreset) -> Vec<Planned> {
    vision
        .tensors()
        .into_iter()
        .map(|spec| Planned {
            ty: if spec.dims.len() < 2 {
                GgmlType::F32
            } else {
                GgmlType::F16
            },
            spec,
        })
        .collect()
}

/// The list of tensors and their types that [`synth`] would write for a
/// preset and scheme, as `(name, type, dims)`.
pub fn planned_tensors(preset: &ArchPreset, quant: Quant) -> Vec<(String, GgmlType, Vec<u64>)> {
    plan_model(preset, quant)
        .into_iter()
        .map(|p| (p.spec.name, p.ty, p.spec.dims))
        .collect()
}

/// Generates the model (and, if requested, its mmproj) described by `opts`.
///
/// `progress(done, total)` is called from the calling thread after every
/// chunk written, with byte counts over all files' tensor data. Files are
/// written under a temporary name and renamed into place when complete.
pub fn synth(opts: &SynthOptions, progress: impl Fn(u64, u64)) -> Result<SynthReport, SynthError> {
    let start = Instant::now();
    let preset = by_name(&opts.preset)?;
    let vision = match (&opts.mmproj_output, preset.vision) {
        (None, _) => None,
        (Some(p), Some(v)) => Some((p.clone(), v)),
        (Some(_), None) => return Err(SynthError::NoVisionTower(preset.name.into())),
    };

    let vocab = tokenizer::build(&preset.tokenizer).map_err(|source| SynthError::Tokenizer {
        preset: preset.name.into(),
        source,
    })?;
    let model_plan = plan_model(&preset, opts.quant);
    let mut model_kv = preset.metadata();
    model_kv.push(("general.file_type".into(), opts.quant.file_type().into()));
    model_kv.push(("general.quantization_version".into(), 2u32.into()));
    model_kv.extend(vocab.metadata());

    let mmproj_plan = vision.as_ref().map(|(_, v)| plan_mmproj(v));
    let total: u64 = model_plan
        .iter()
        .chain(mmproj_plan.iter().flatten())
        .map(quantize_nbytes)
        .sum();

    let threads = if opts.threads == 0 {
        std::thread::available_parallelism().map_or(4, |n| n.get())
    } else {
        opts.threads
    };

    let mut done = 0u64;
    let model = write_file(&opts.output, model_kv, &model_plan, opts.seed, threads, &mut |n| {
        done += n;
        progress(done, total);
    })?;
    let mmproj = match (vision, mmproj_plan) {
        (Some((path, v)), Some(plan)) => {
            let mut kv = v.metadata(preset.name);
            kv.push(("general.file_type".into(), Quant::F16.file_type().into()));
            Some(write_file(
                &path,
                kv,
                &plan,
                opts.seed ^ 0x5eed_f1ce,
                threads,
                &mut |n| {
                    done += n;
                    progress(done, total);
                },
            )?)
        }
        _ => None,
    };
    Ok(SynthReport {
        preset: preset.name.into(),
        quant: opts.quant,
        model,
        mmproj,
        elapsed: start.elapsed(),
    })
}

fn quantize_nbytes(p: &Planned) -> u64 {
    crate::gguf::nbytes(p.ty, &p.spec.dims).unwrap_or(0)
}

/// A chunk of one tensor: blocks `[first, first + count)`.
#[derive(Debug, Clone, Copy)]
struct Job {
    tensor: usize,
    first_block: u64,
    n_blocks: u64,
}

/// Splits every tensor into chunks of about [`CHUNK_BYTES`].
fn jobs(plan: &[Planned]) -> Vec<Job> {
    let mut out = Vec::new();
    for (i, p) in plan.iter().enumerate() {
        let bs = p.ty.type_size();
        let n_blocks = quantize_nbytes(p) / bs;
        let per = (CHUNK_BYTES / bs).max(1);
        let mut b = 0;
        while b < n_blocks {
            let n = per.min(n_blocks - b);
            out.push(Job {
                tensor: i,
                first_block: b,
                n_blocks: n,
            });
            b += n;
        }
    }
    out
}

fn generate(plan: &[Planned], job: Job, seed: u64) -> Vec<u8> {
    let p = &plan[job.tensor];
    let mut buf = vec![0u8; (job.n_blocks * p.ty.type_size()) as usize];
    let mut rng = WyRand::for_stream(seed, job.tensor as u64, job.first_block);
    // types were checked with `can_generate` before any job started
    let _ = quantize::fill_blocks(p.ty, p.spec.init, &mut rng, &mut buf);
    buf
}

/// Writes one GGUF file: plans the layout, then generates chunks on
/// `threads` workers and writes them in order. `on_bytes` receives the size
/// of every chunk written.
fn write_file(
    path: &Path,
    metadata: Vec<(String, GgufValue)>,
    plan: &[Planned],
    seed: u64,
    threads: usize,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<FileReport, SynthError> {
    let werr = |source| SynthError::Write {
        path: path.to_path_buf(),
        source,
    };
    for p in plan {
        if !quantize::can_generate(p.ty) {
            return Err(SynthError::UnsupportedType {
                tensor: p.spec.name.clone(),
                ty: p.ty,
            });
        }
    }
    let mut w = GgufWriter::new();
    for (k, v) in metadata {
        w.add_kv(k, v).map_err(werr)?;
    }
    let mut type_counts = BTreeMap::new();
    for p in plan {
        w.add_tensor(p.spec.name.clone(), p.ty, &p.spec.dims).map_err(werr)?;
        *type_counts.entry(p.ty).or_insert(0) += 1;
    }
    let file_size = w.file_size();

    let tmp = temp_path(path);
    let io_err = |source| SynthError::Io {
        path: tmp.clone(),
        source,
    };
    let file = fs::File::create(&tmp).map_err(io_err)?;
    let mut out = w
        .start(BufWriter::with_capacity(FILE_BUFFER_BYTES, file))
        .map_err(werr)?;

    let jobs = jobs(plan);
    let result = run_pipeline(plan, &jobs, seed, threads, |chunk| {
        out.write_chunk(&chunk)?;
        on_bytes(chunk.len() as u64);
        Ok(())
    });
    let finish = result.and_then(|()| out.finish().map(drop));
    if let Err(e) = finish {
        let _ = fs::remove_file(&tmp);
        return Err(werr(e));
    }
    fs::rename(&tmp, path).map_err(|source| SynthError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(FileReport {
        path: path.to_path_buf(),
        bytes: file_size,
        n_tensors: plan.len(),
        n_params: plan.iter().map(|p| p.spec.dims.iter().product::<u64>()).sum(),
        type_counts,
    })
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    path.with_file_name(name)
}

/// Generates `jobs` on `threads` workers and hands the chunks to `sink` in
/// job order. Workers run at most `2 * threads` chunks ahead of the sink.
fn run_pipeline(
    plan: &[Planned],
    jobs: &[Job],
    seed: u64,
    threads: usize,
    mut sink: impl FnMut(Vec<u8>) -> Result<(), GgufWriteError>,
) -> Result<(), GgufWriteError> {
    let threads = threads.max(1);
    let ahead = 2 * threads;
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let written = Mutex::new(0usize);
    let cv = Condvar::new();
    let (tx, rx) = mpsc::channel::<(usize, Vec<u8>)>();

    std::thread::scope(|s| {
        for _ in 0..threads {
            let tx = tx.clone();
            let (next, stop, written, cv) = (&next, &stop, &written, &cv);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs.len() {
                    break;
                }
                {
                    let mut w = written.lock().unwrap_or_else(|e| e.into_inner());
                    while i >= *w + ahead && !stop.load(Ordering::Relaxed) {
                        w = cv.wait(w).unwrap_or_else(|e| e.into_inner());
                    }
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let chunk = generate(plan, jobs[i], seed);
                if tx.send((i, chunk)).is_err() {
                    break;
                }
            });
        }
        drop(tx);

        let mut pending: HashMap<usize, Vec<u8>> = HashMap::new();
        let mut result = Ok(());
        for i in 0..jobs.len() {
            let chunk = loop {
                if let Some(c) = pending.remove(&i) {
                    break Some(c);
                }
                match rx.recv() {
                    Ok((j, c)) => {
                        pending.insert(j, c);
                    }
                    Err(_) => break None,
                }
            };
            let Some(chunk) = chunk else {
                // workers are gone (cannot happen unless one panicked)
                break;
            };
            if let Err(e) = sink(chunk) {
                result = Err(e);
                break;
            }
            *written.lock().unwrap_or_else(|e| e.into_inner()) = i + 1;
            cv.notify_all();
        }
        stop.store(true, Ordering::Relaxed);
        cv.notify_all();
        drop(rx);
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufFile, ModelInfo, TensorRole};

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("synth-{tag}-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn tiny_presets_round_trip_through_the_reader() {
        let dir = tmpdir("tiny");
        for preset in presets::all().into_iter().filter(|p| p.name.starts_with("tiny-")) {
            for quant in Quant::ALL {
                let out = dir.join(format!("{}-{}.gguf", preset.name, quant));
                let mut opts = SynthOptions::new(preset.name, quant, &out);
                opts.threads = 3;
                let calls = std::cell::Cell::new(0u64);
                let last = std::cell::Cell::new((0u64, 0u64));
                let r = synth(&opts, |d, t| {
                    calls.set(calls.get() + 1);
                    last.set((d, t));
                })
                .unwrap();
                assert!(calls.get() > 0);
                assert_eq!(last.get().0, last.get().1);

                let f = GgufFile::open(&out).unwrap();
                assert_eq!(f.file_size(), r.model.bytes);
                assert_eq!(f.file_size(), fs::metadata(&out).unwrap().len());
                let expected = planned_tensors(&preset, quant);
                assert_eq!(f.tensors().len(), expected.len());
                for (t, (name, ty, dims)) in f.tensors().iter().zip(&expected) {
                    assert_eq!(&t.name, name);
                    assert_eq!(&t.ty, ty, "{name}");
                    assert_eq!(&t.dims, dims, "{name}");
                }
                assert_eq!(f.architecture(), Some(preset.arch));
                assert_eq!(f.get_array_len("tokenizer.ggml.tokens"), Some(preset.n_vocab as usize));
                assert_eq!(f.get_u64("general.file_type"), Some(u64::from(quant.file_type())));

                let m = ModelInfo::from_gguf(&f).unwrap();
                assert_eq!(m.n_layer, preset.n_layer);
                assert_eq!(m.n_embd, preset.n_embd);
                // the family's own head layout (MLA's one latent KV head)
                let key = |k: &str| f.get_u64(&format!("{}.{k}", preset.arch));
                assert_eq!(Some(m.head_dim_k), key("attention.key_length"));
                let heads_kv = f.get_array(&format!("{}.attention.head_count_kv", preset.arch));
                let heads_kv = heads_kv.and_then(|a| a.to_u64_vec()).map(|v| v[0]);
                assert_eq!(
                    Some(u64::from(m.n_head_kv[0])),
                    key("attention.head_count_kv").or(heads_kv)
                );
                assert_eq!(m.n_vocab, Some(preset.n_vocab));
                assert_eq!(m.n_expert, preset.n_expert);
                assert_eq!(m.n_params(), preset.n_params());
                assert!(m.tensors.iter().all(|t| t.role != TensorRole::Other));
                assert!(!out.with_extension("gguf.partial").exists());
            }
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn q4_k_m_tiny_mix_uses_fallbacks_and_f32_norms() {
        let p = by_name("tiny-qwen3-30b-a3b").unwrap();
        let plan = planned_tensors(&p, Quant::Q4_K_M);
        let ty = |n: &str| plan.iter().find(|t| t.0 == n).unwrap().1;
        assert_eq!(ty("output.weight"), GgmlType::Q6_K);
        assert_eq!(ty("token_embd.weight"), GgmlType::Q4_K);
        assert_eq!(ty("blk.0.ffn_gate_inp.weight"), GgmlType::F32);
        assert_eq!(ty("blk.0.attn_q_norm.weight"), GgmlType::F32);
        // 128-wide expert rows: Q4_K -> Q5_0, Q6_K -> Q8_0
        assert_eq!(ty("blk.1.ffn_up_exps.weight"), GgmlType::Q4_K);
        assert_eq!(ty("blk.1.ffn_down_exps.weight"), GgmlType::Q5_0);
        assert_eq!(ty("blk.3.ffn_down_exps.weight"), GgmlType::Q8_0);
        // attn_output rows are 512 wide (4 heads x 128)
        assert_eq!(ty("blk.1.attn_output.weight"), GgmlType::Q4_K);
    }

    #[test]
    fn vl_preset_writes_an_mmproj_clip_can_load() {
        let dir = tmpdir("vl");
        let out = dir.join("m.gguf");
        let mm = dir.join("mmproj.gguf");
        let mut opts = SynthOptions::new("tiny-qwen2.5-vl-7b", Quant::Q8_0, &out);
        opts.mmproj_output = Some(mm.clone());
        let r = synth(&opts, |_, _| {}).unwrap();
        let rep = r.mmproj.unwrap();
        let f = GgufFile::open(&mm).unwrap();
        assert_eq!(f.file_size(), rep.bytes);
        assert_eq!(f.architecture(), Some("clip"));
        assert_eq!(f.get_str("clip.projector_type"), Some("qwen2.5vl_merger"));
        assert_eq!(f.get_u64("clip.vision.projection_dim"), Some(256));
        for name in [
            "v.patch_embd.weight",
            "v.patch_embd.weight.1",
            "v.blk.0.attn_q.weight",
            "v.blk.0.attn_q.bias",
            "v.blk.3.ffn_down.weight",
            "v.post_ln.weight",
            "mm.0.weight",
            "mm.2.bias",
        ] {
            assert!(f.tensor(name).is_some(), "{name}");
        }
        assert_eq!(f.tensor("v.patch_embd.weight").unwrap().ty, GgmlType::F16);
        assert_eq!(f.tensor("mm.2.bias").unwrap().dims, vec![256]);
        // the language model carries the M-RoPE sections
        let lm = GgufFile::open(&out).unwrap();
        assert_eq!(
            lm.get_array("qwen2vl.rope.dimension_sections")
                .and_then(|a| a.to_u64_vec()),
            Some(vec![8, 12, 12, 0])
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn output_is_deterministic_across_thread_counts() {
        let dir = tmpdir("det");
        let a = dir.join("a.gguf");
        let b = dir.join("b.gguf");
        let mut o = SynthOptions::new("tiny-llama3.1-8b", Quant::Q4_K_M, &a);
        o.threads = 1;
        o.seed = 9;
        synth(&o, |_, _| {}).unwrap();
        o.output = b.clone();
        o.threads = 5;
        synth(&o, |_, _| {}).unwrap();
        assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors() {
        let e = synth(&SynthOptions::new("nope", Quant::F16, "/tmp/x.gguf"), |_, _| {}).unwrap_err();
        assert!(matches!(e, SynthError::UnknownPreset(_)));
        assert!(e.to_string().contains("available presets"));
        let mut o = SynthOptions::new("tiny-llama3.1-8b", Quant::F16, "/tmp/x.gguf");
        o.mmproj_output = Some("/tmp/y.gguf".into());
        assert!(matches!(synth(&o, |_, _| {}), Err(SynthError::NoVisionTower(_))));
        let o = SynthOptions::new("tiny-llama3.1-8b", Quant::F16, "/nonexistent-dir/x.gguf");
        assert!(matches!(synth(&o, |_, _| {}), Err(SynthError::Io { .. })));
    }

    #[test]
    fn chunking_covers_every_tensor_exactly() {
        let p = by_name("tiny-qwen3-235b-a22b").unwrap();
        let plan = plan_model(&p, Quant::Q4_0);
        let js = jobs(&plan);
        let mut per_tensor = vec![0u64; plan.len()];
        for j in &js {
            per_tensor[j.tensor] += j.n_blocks * plan[j.tensor].ty.type_size();
        }
        for (i, pl) in plan.iter().enumerate() {
            assert_eq!(per_tensor[i], quantize_nbytes(pl));
        }
    }
}

/// Why [`model_info`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelInfoError {
    #[error(transparent)]
    UnknownPreset(#[from] UnknownPreset),
    #[error("describing the preset: {0}")]
    Write(#[from] crate::gguf::GgufWriteError),
    #[error("describing the preset: {0}")]
    Read(#[from] crate::gguf::GgufError),
    #[error("describing the preset: {0}")]
    Model(#[from] crate::gguf::ModelInfoError),
}

/// The [`ModelInfo`](crate::gguf::ModelInfo) of a preset as `synth` would write
/// it, without writing any weights: plan a model before having it.
pub fn model_info(preset: &str, quant: Quant) -> Result<crate::gguf::ModelInfo, ModelInfoError> {
    let p = presets::by_name(preset)?;
    let mut w = crate::gguf::GgufWriter::new();
    for (k, v) in p.metadata() {
        w.add_kv(k, v)?;
    }
    let mut data_end = 0u64;
    for (name, ty, dims) in planned_tensors(&p, quant) {
        let t = w.add_tensor(name, ty, &dims)?;
        data_end = data_end.max(t.offset + t.nbytes);
    }
    let mut header = Vec::new();
    drop(w.start(&mut header)?);
    let size = header.len() as u64 + data_end;
    let file = crate::gguf::GgufFile::from_reader(header.as_slice(), size, format!("<preset {preset}>"))?;
    Ok(crate::gguf::ModelInfo::from_gguf(&file)?)
}
