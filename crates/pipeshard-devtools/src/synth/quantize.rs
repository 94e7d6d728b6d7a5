//! Quantization schemes for synthetic models: which ggml type each tensor
//! gets (mirroring `llama_tensor_get_type` in upstream `src/llama-quant.cpp`)
//! and how to fill valid random blocks of each type.

use std::fmt;

use super::rng::WyRand;
use crate::gguf::GgmlType;

/// A whole-model quantization scheme, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum Quant {
    /// `q4_0`: Q4_0 weights (Q6_K output, as llama-quantize does).
    Q4_0,
    /// `q8_0`: Q8_0 weights.
    Q8_0,
    /// `q4_k_m`: llama.cpp's Q4_K_M mix (Q4_K, with Q6_K for the output and
    /// some attn_v / ffn_down layers).
    Q4_K_M,
    /// `q5_k_m`: llama.cpp's Q5_K_M mix (Q5_K, with Q6_K where Q4_K_M has
    /// it).
    Q5_K_M,
    /// `q6_k`: Q6_K weights.
    Q6_K,
    /// `mxfp4`: llama.cpp's MXFP4_MOE (gpt-oss): routed experts in MXFP4,
    /// every other quantized weight Q8_0.
    MXFP4,
    /// `f16`: unquantized F16 weights.
    F16,
}

impl Quant {
    /// All schemes.
    pub const ALL: [Quant; 7] = [
        Quant::Q4_0,
        Quant::Q8_0,
        Quant::Q4_K_M,
        Quant::Q5_K_M,
        Quant::Q6_K,
        Quant::MXFP4,
        Quant::F16,
    ];

    /// Parses a scheme name (`q4_0`, `q8_0`, `q4_k_m`, `q5_k_m`, `q6_k`,
    /// `mxfp4`, `f16`; any case).
    pub fn from_name(name: &str) -> Option<Quant> {
        Quant::ALL.iter().copied().find(|q| q.name().eq_ignore_ascii_case(name))
    }

    /// Every scheme's name, for messages: `q4_0, q8_0, ... or f16`.
    pub fn names() -> String {
        let names: Vec<&str> = Quant::ALL.iter().map(|q| q.name()).collect();
        let (last, rest) = names.split_last().unwrap_or((&"", &[]));
        format!("{} or {last}", rest.join(", "))
    }

    /// The scheme's name.
    pub fn name(self) -> &'static str {
        match self {
            Quant::Q4_0 => "q4_0",
            Quant::Q8_0 => "q8_0",
            Quant::Q4_K_M => "q4_k_m",
            Quant::Q5_K_M => "q5_k_m",
            Quant::Q6_K => "q6_k",
            Quant::MXFP4 => "mxfp4",
            Quant::F16 => "f16",
        }
    }

    /// The `general.file_type` value (`enum llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            Quant::F16 => 1,
            Quant::Q4_0 => 2,
            Quant::Q8_0 => 7,
            Quant::Q4_K_M => 15,
            Quant::Q5_K_M => 17,
            Quant::Q6_K => 18,
            Quant::MXFP4 => 38,
        }
    }

    /// The default type of quantizable weights
    /// (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        match self {
            Quant::F16 => GgmlType::F16,
            Quant::Q4_0 => GgmlType::Q4_0,
            Quant::Q8_0 => GgmlType::Q8_0,
            Quant::Q4_K_M => GgmlType::Q4_K,
            Quant::Q5_K_M => GgmlType::Q5_K,
            Quant::Q6_K => GgmlType::Q6_K,
            Quant::MXFP4 => GgmlType::MXFP4,
        }
    }
}

impl fmt::Display for Quant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Model facts the type selection depends on.
#[derive(Debug, Clone, Copy)]
pub struct MixContext {
    /// Number of layers (`n_layer`; also the number of attn_v tensors).
    pub n_layer: u32,
    /// Number of routed experts (0 for dense models).
    pub n_expert: u32,
    /// Whether the model has a separate `output.weight` (untied embeddings).
    pub has_output: bool,
}

/// `use_more_bits` from llama-quant.cpp: the first and last eighth of the
/// layers, and every third layer in between.
pub fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8).rem_euclid(3) == 2
}

fn layer_of(name: &str) -> Option<i64> {
    crate::gguf::parse_layer(name).map(|(l, _)| i64::from(l))
}

/// Whether llama-quantize would quantize this tensor at all
/// (`tensor_allows_quantization`, for the tensor names synth produces).
pub fn allows_quantization(name: &str, dims: &[u64]) -> bool {
    dims.len() >= 2
        && name.ends_with("weight")
        && !name.contains("_norm.weight")
        && !name.contains("ffn_gate_inp.weight")
        && !name.contains("ssm_conv1d")
        && !name.contains(".position_embd")
        && !name.contains(".patch_embd")
        && !name.contains(".patch_merger")
}

/// The ggml type llama.cpp would give tensor `name` of shape `dims` under
/// `quant`, assuming an F32/F16 source (norms, biases and the MoE router
/// stay F32; other weights are F16 in an `f16` file).
pub fn tensor_type(quant: Quant, name: &str, dims: &[u64], ctx: &MixContext) -> GgmlType {
    if dims.len() < 2 || !name.ends_with("weight") || name.contains("_norm.weight") {
        return GgmlType::F32;
    }
    if name.contains("ffn_gate_inp") || name.contains("ssm_conv1d") {
        // the router and the recurrent convolution are F32 in converted
        // models and never quantized
        return GgmlType::F32;
    }
    if !allows_quantization(name, dims) || quant == Quant::F16 {
        return GgmlType::F16;
    }

    let default = quant.default_type();
    let mut ty = default;
    let nx = dims[0];
    let is_output = name == "output.weight";
    let is_tok = name == "token_embd.weight";
    let is_attn_v =
        name.contains("attn_v.weight") || name.contains("attn_qkv.weight") || name.contains("attn_kv_b.weight");

    let more_bits = matches!(quant, Quant::Q4_K_M | Quant::Q5_K_M);
    if quant == Quant::MXFP4 {
        // Routed experts (three dimensions) MXFP4, every other weight and
        // the output Q8_0.
        let experts = !is_output && dims.get(2).is_some_and(|&n| n > 1);
        ty = if experts { GgmlType::MXFP4 } else { GgmlType::Q8_0 };
    } else if is_output || (is_tok && !ctx.has_output) {
        if nx % ty.block_size() != 0 {
            ty = GgmlType::Q8_0;
        } else if ty != GgmlType::Q8_0 {
            ty = GgmlType::Q6_K;
        }
    } else if is_tok {
        // untied token embeddings keep the default type for these schemes
    } else if is_attn_v {
        if more_bits {
            // one attn_v per layer, visited in layer order
            let i = layer_of(name).unwrap_or(0);
            if use_more_bits(i, i64::from(ctx.n_layer)) {
                ty = GgmlType::Q6_K;
            }
        }
        if ctx.n_expert == 8 {
            ty = GgmlType::Q8_0;
        }
    } else if name.contains("attn_k.weight") {
        if ctx.n_expert == 8 {
            ty = GgmlType::Q8_0;
        }
    } else if name.contains("ffn_down") {
        if more_bits {
            let i = layer_of(name).unwrap_or(0);
            if use_more_bits(i, i64::from(ctx.n_layer)) {
                ty = GgmlType::Q6_K;
            }
        }
    } else if name.contains("attn_output.weight") && ctx.n_expert == 8 && quant == Quant::Q4_K_M {
        ty = GgmlType::Q5_K;
    }

    fallback(ty, nx)
}

/// `tensor_type_fallback`: demote a type whose block does not divide the row
/// length, and use F16 when even the fallback does not fit.
pub fn fallback(ty: GgmlType, ncols: u64) -> GgmlType {
    if ncols % ty.block_size() == 0 {
        return ty;
    }
    use GgmlType::*;
    let demoted = match ty {
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        Q2_0 | Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        other => other,
    };
    if ncols % demoted.block_size() != 0 {
        F16
    } else {
        demoted
    }
}

/// How a tensor's values are initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// All ones (norm weights).
    Ones,
    /// All zeros (biases).
    Zeros,
    /// Random, zero-mean, with roughly this standard deviation.
    Random {
        /// Target standard deviation.
        sigma: f32,
    },
}

/// Whether [`fill_blocks`] can generate data of type `ty`.
pub fn can_generate(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K | MXFP4
    )
}

/// Converts an f32 to IEEE half bits, rounding to nearest even.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x007f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x0200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x0080_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rounded = m + half - 1 + ((m >> shift) & 1);
        return sign | (rounded >> shift) as u16;
    }
    let mut out = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && (out & 1) == 1) {
        out += 1;
    }
    sign | out as u16
}

/// Converts IEEE half bits to f32.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    let bits = if exp == 0 {
        if mant == 0 {
            sign
        } else {
            // subnormal: value = mant * 2^-24
            let v = mant as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (mant << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (mant << 13)
    };
    f32::from_bits(bits)
}

/// Converts an f32 to bfloat16 bits, rounding to nearest even.
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// Standard deviation of a uniform integer on `[0, n)`.
fn uniform_std(n: f32) -> f32 {
    ((n * n - 1.0) / 12.0).sqrt()
}

/// Replaces every zero nibble by 8, so that `q - 8` on 4-bit quants is
/// symmetric around zero (values 1..=15, with 8 twice as likely) instead of
/// biased by half a step.
pub fn center_nibbles(bytes: &mut [u8]) {
    const LOW: u64 = 0x1111_1111_1111_1111;
    let mut chunks = bytes.chunks_exact_mut(8);
    for c in &mut chunks {
        let mut a = [0u8; 8];
        a.copy_from_slice(c);
        let x = u64::from_le_bytes(a);
        let mut t = x | (x >> 1);
        t |= t >> 2;
        let zero = !t & LOW;
        c.copy_from_slice(&(x | (zero << 3)).to_le_bytes());
    }
    for b in chunks.into_remainder() {
        for shift in [0, 4] {
            if (*b >> shift) & 15 == 0 {
                *b |= 8 << shift;
            }
        }
    }
}

/// Standard deviation of `q - 8` after [`center_nibbles`]:
/// `sqrt(2 * (1 + 4 + … + 49) / 16)`.
const CENTERED_NIBBLE_STD: f32 = 4.183_3;

/// Packs eight 6-bit scales and mins into the 12-byte K-quant layout read by
/// `get_scale_min_k4`.
pub fn pack_scales_k4(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4);
    }
    q
}

/// `get_scale_min_k4` from ggml-quants.c (used by tests to check packing).
pub fn unpack_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Fills `out` (a whole number of blocks of `ty`) with valid data for `init`.
///
/// Quantized blocks get random quants and small positive f16 scales chosen
/// so that the dequantized weights are roughly zero-mean with standard
/// deviation `sigma`. Returns `false` if the type cannot be generated or
/// `out` is not a whole number of blocks.
pub fn fill_blocks(ty: GgmlType, init: Init, rng: &mut WyRand, out: &mut [u8]) -> bool {
    let bs = ty.type_size() as usize;
    if !can_generate(ty) || out.len() % bs != 0 {
        return false;
    }
    let sigma = match init {
        Init::Zeros => {
            out.fill(0);
            return true;
        }
        Init::Ones => {
            let one: Vec<u8> = match ty {
                GgmlType::F32 => 1.0f32.to_le_bytes().to_vec(),
                GgmlType::F16 => f32_to_f16(1.0).to_le_bytes().to_vec(),
                GgmlType::BF16 => f32_to_bf16(1.0).to_le_bytes().to_vec(),
                _ => return false,
            };
            for c in out.chunks_exact_mut(one.len()) {
                c.copy_from_slice(&one);
            }
            return true;
        }
        Init::Random { sigma } => sigma.abs().max(1e-6),
    };
    // per-block scale jitter in [0.75, 1.25)
    let jitter = |rng: &mut WyRand| 0.75 + 0.5 * rng.next_f32();
    let h = |x: f32| f32_to_f16(x).to_le_bytes();
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            // uniform on [-a, a] has std a / sqrt(3)
            let a = sigma * 3f32.sqrt();
            let n = ty.type_size() as usize;
            for c in out.chunks_exact_mut(n) {
                let v = (rng.next_f32() * 2.0 - 1.0) * a;
                match ty {
                    GgmlType::F32 => c.copy_from_slice(&v.to_le_bytes()),
                    GgmlType::F16 => c.copy_from_slice(&h(v)),
                    _ => c.copy_from_slice(&f32_to_bf16(v).to_le_bytes()),
                }
            }
        }
        GgmlType::Q4_0 => {
            let d0 = sigma / CENTERED_NIBBLE_STD;
            for b in out.chunks_exact_mut(bs) {
                b[0..2].copy_from_slice(&h(d0 * jitter(rng)));
                rng.fill_bytes(&mut b[2..18]);
                center_nibbles(&mut b[2..18]);
            }
        }
        GgmlType::Q4_1 => {
            let d0 = sigma / uniform_std(16.0);
            for b in out.chunks_exact_mut(bs) {
                let d = d0 * jitter(rng);
                b[0..2].copy_from_slice(&h(d));
                b[2..4].copy_from_slice(&h(-7.5 * d));
                rng.fill_bytes(&mut b[4..20]);
            }
        }
        GgmlType::Q5_0 => {
            // q = nibble + 16 * high bit; centred nibbles make q - 16 symmetric
            let std = (CENTERED_NIBBLE_STD * CENTERED_NIBBLE_STD + 64.0).sqrt();
            let d0 = sigma / std;
            for b in out.chunks_exact_mut(bs) {
                b[0..2].copy_from_slice(&h(d0 * jitter(rng)));
                rng.fill_bytes(&mut b[2..22]);
                center_nibbles(&mut b[6..22]);
            }
        }
        GgmlType::Q5_1 => {
            let d0 = sigma / uniform_std(32.0);
            for b in out.chunks_exact_mut(bs) {
                let d = d0 * jitter(rng);
                b[0..2].copy_from_slice(&h(d));
                b[2..4].copy_from_slice(&h(-15.5 * d));
                rng.fill_bytes(&mut b[4..24]);
            }
        }
        GgmlType::Q8_0 => {
            let d0 = sigma / uniform_std(256.0);
            for b in out.chunks_exact_mut(bs) {
                b[0..2].copy_from_slice(&h(d0 * jitter(rng)));
                rng.fill_bytes(&mut b[2..34]);
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            // w = d*sc*q - dmin*m with m = sc and dmin = d*(levels-1)/2 gives
            // w = d*sc*(q - (levels-1)/2): zero-mean, std d*sc*uniform_std.
            let (levels, payload): (f32, usize) = if ty == GgmlType::Q4_K { (16.0, 128) } else { (32.0, 160) };
            let d0 = sigma / (uniform_std(levels) * 32.0);
            for b in out.chunks_exact_mut(bs) {
                let d = d0 * jitter(rng);
                b[0..2].copy_from_slice(&h(d));
                b[2..4].copy_from_slice(&h(d * (levels - 1.0) / 2.0));
                let mut sc = [0u8; 8];
                for s in &mut sc {
                    *s = rng.range_u8(24, 40);
                }
                b[4..16].copy_from_slice(&pack_scales_k4(&sc, &sc));
                rng.fill_bytes(&mut b[16..16 + payload]);
            }
        }
        GgmlType::Q6_K => {
            // layout: ql[128], qh[64], scales[16] (i8), d (f16)
            let d0 = sigma / (uniform_std(64.0) * 20.0);
            for b in out.chunks_exact_mut(bs) {
                rng.fill_bytes(&mut b[0..192]);
                for s in &mut b[192..208] {
                    *s = rng.range_u8(16, 24);
                }
                b[208..210].copy_from_slice(&h(d0 * jitter(rng)));
            }
        }
        GgmlType::MXFP4 => {
            // layout: e (E8M0 exponent, the values' scale 2^(e - 128) with
            // ggml's doubled E2M1 values), qs[16] (E2M1 nibbles). Each
            // block's exponent is one of the two around the one that gives
            // `sigma`, picked so that the variance's mean is sigma^2.
            let x = 128.0 + (sigma / MXFP4_STD).log2();
            let lo = x.floor();
            let p_hi = (4f32.powf(x - lo) - 1.0) / 3.0;
            let e = |rng: &mut WyRand| (lo + f32::from(u8::from(rng.next_f32() < p_hi))).clamp(1.0, 254.0) as u8;
            for b in out.chunks_exact_mut(bs) {
                b[0] = e(rng);
                rng.fill_bytes(&mut b[1..17]);
            }
        }
        _ => return false,
    }
    true
}

/// Standard deviation of ggml's doubled E2M1 values (`kvalues_mxfp4`) over
/// uniform nibbles: `sqrt(2 * (1 + 4 + 9 + 16 + 36 + 64 + 144) / 16)`.
const MXFP4_STD: f32 = 5.852_35;

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(n_layer: u32, n_expert: u32, has_output: bool) -> MixContext {
        MixContext {
            n_layer,
            n_expert,
            has_output,
        }
    }

    #[test]
    fn names_and_file_types() {
        for q in Quant::ALL {
            assert_eq!(Quant::from_name(q.name()), Some(q));
        }
        assert_eq!(Quant::from_name("Q4_K_M"), Some(Quant::Q4_K_M));
        assert_eq!(Quant::from_name("q5_k_s"), None);
        assert_eq!(Quant::Q4_K_M.file_type(), 15);
    }

    #[test]
    fn use_more_bits_matches_upstream_for_32_layers() {
        let picked: Vec<i64> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        // i < 4, i >= 28, (i - 4) % 3 == 2
        assert_eq!(picked, vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
    }

    #[test]
    fn q4_k_m_mix_for_a_dense_model() {
        let c = ctx(32, 0, true);
        let t = |name: &str, dims: &[u64]| tensor_type(Quant::Q4_K_M, name, dims, &c);
        assert_eq!(t("output.weight", &[4096, 128256]), GgmlType::Q6_K);
        assert_eq!(t("token_embd.weight", &[4096, 128256]), GgmlType::Q4_K);
        assert_eq!(t("blk.0.attn_v.weight", &[4096, 1024]), GgmlType::Q6_K);
        assert_eq!(t("blk.4.attn_v.weight", &[4096, 1024]), GgmlType::Q4_K);
        assert_eq!(t("blk.6.attn_v.weight", &[4096, 1024]), GgmlType::Q6_K);
        assert_eq!(t("blk.6.ffn_down.weight", &[14336, 4096]), GgmlType::Q6_K);
        assert_eq!(t("blk.7.ffn_down.weight", &[14336, 4096]), GgmlType::Q4_K);
        assert_eq!(t("blk.7.attn_q.weight", &[4096, 4096]), GgmlType::Q4_K);
        assert_eq!(t("blk.7.attn_norm.weight", &[4096]), GgmlType::F32);
        assert_eq!(t("blk.7.attn_q.bias", &[4096]), GgmlType::F32);
        // row length not divisible by 256: fallbacks
        assert_eq!(t("blk.7.attn_q.weight", &[4000, 4096]), GgmlType::Q5_0);
        assert_eq!(t("blk.0.ffn_down.weight", &[4000, 4096]), GgmlType::Q8_0);
        assert_eq!(t("output.weight", &[4000, 100]), GgmlType::Q8_0);
        assert_eq!(t("blk.7.attn_q.weight", &[100, 4096]), GgmlType::F16);
    }

    #[test]
    fn tied_embeddings_take_the_output_type() {
        let c = ctx(4, 0, false);
        assert_eq!(
            tensor_type(Quant::Q4_K_M, "token_embd.weight", &[256, 1000], &c),
            GgmlType::Q6_K
        );
        assert_eq!(
            tensor_type(Quant::Q4_0, "token_embd.weight", &[256, 1000], &c),
            GgmlType::Q6_K
        );
        assert_eq!(
            tensor_type(Quant::Q8_0, "token_embd.weight", &[256, 1000], &c),
            GgmlType::Q8_0
        );
    }

    #[test]
    fn other_schemes() {
        let c = ctx(48, 128, true);
        assert_eq!(
            tensor_type(Quant::Q4_0, "output.weight", &[2048, 151936], &c),
            GgmlType::Q6_K
        );
        assert_eq!(
            tensor_type(Quant::Q4_0, "blk.0.ffn_down_exps.weight", &[768, 2048, 128], &c),
            GgmlType::Q4_0
        );
        assert_eq!(
            tensor_type(Quant::Q4_0, "blk.0.ffn_gate_inp.weight", &[2048, 128], &c),
            GgmlType::F32
        );
        assert_eq!(
            tensor_type(Quant::Q8_0, "output.weight", &[2048, 151936], &c),
            GgmlType::Q8_0
        );
        assert_eq!(
            tensor_type(Quant::F16, "blk.0.attn_q.weight", &[2048, 4096], &c),
            GgmlType::F16
        );
        assert_eq!(
            tensor_type(Quant::F16, "blk.0.attn_q_norm.weight", &[128], &c),
            GgmlType::F32
        );
        assert_eq!(
            tensor_type(Quant::Q4_K_M, "blk.0.ffn_down_exps.weight", &[768, 2048, 128], &c),
            GgmlType::Q6_K
        );
        assert_eq!(
            tensor_type(Quant::Q4_K_M, "blk.7.ffn_down_exps.weight", &[768, 2048, 128], &c),
            GgmlType::Q4_K
        );
        // eight experts bump attn_v/attn_k to Q8_0 and attn_output to Q5_K
        let c8 = ctx(32, 8, true);
        for q in [Quant::Q4_0, Quant::Q4_K_M] {
            assert_eq!(
                tensor_type(q, "blk.3.attn_k.weight", &[4096, 1024], &c8),
                GgmlType::Q8_0
            );
        }
        assert_eq!(
            tensor_type(Quant::Q4_K_M, "blk.3.attn_output.weight", &[4096, 4096], &c8),
            GgmlType::Q5_K
        );
    }

    #[test]
    fn q5_k_m_q6_k_and_mxfp4_mixes() {
        let dense = ctx(32, 0, true);
        let t = |q: Quant, name: &str, dims: &[u64]| tensor_type(q, name, dims, &dense);
        assert_eq!(t(Quant::Q5_K_M, "blk.7.attn_q.weight", &[4096, 4096]), GgmlType::Q5_K);
        assert_eq!(
            t(Quant::Q5_K_M, "blk.6.ffn_down.weight", &[14336, 4096]),
            GgmlType::Q6_K
        );
        assert_eq!(
            t(Quant::Q5_K_M, "blk.7.ffn_down.weight", &[14336, 4096]),
            GgmlType::Q5_K
        );
        assert_eq!(t(Quant::Q5_K_M, "blk.0.attn_v.weight", &[4096, 1024]), GgmlType::Q6_K);
        assert_eq!(t(Quant::Q5_K_M, "output.weight", &[4096, 128256]), GgmlType::Q6_K);
        assert_eq!(t(Quant::Q5_K_M, "blk.7.attn_q.weight", &[4000, 4096]), GgmlType::Q5_1);
        assert_eq!(t(Quant::Q6_K, "blk.7.attn_q.weight", &[4096, 4096]), GgmlType::Q6_K);
        assert_eq!(t(Quant::Q6_K, "blk.6.ffn_down.weight", &[14336, 4096]), GgmlType::Q6_K);
        assert_eq!(t(Quant::Q6_K, "output.weight", &[4096, 128256]), GgmlType::Q6_K);
        assert_eq!(t(Quant::Q6_K, "blk.7.attn_q.weight", &[4000, 4096]), GgmlType::Q8_0);
        // MXFP4_MOE: routed experts MXFP4, the rest (output, embeddings
        // included) Q8_0; a dense model has no MXFP4 tensor.
        let moe = ctx(24, 32, true);
        let m = |name: &str, dims: &[u64]| tensor_type(Quant::MXFP4, name, dims, &moe);
        assert_eq!(m("blk.0.ffn_down_exps.weight", &[2880, 2880, 32]), GgmlType::MXFP4);
        assert_eq!(m("blk.0.ffn_gate_exps.weight", &[2880, 2880, 32]), GgmlType::MXFP4);
        assert_eq!(m("blk.0.attn_q.weight", &[2880, 4096]), GgmlType::Q8_0);
        assert_eq!(m("output.weight", &[2880, 201088]), GgmlType::Q8_0);
        assert_eq!(m("token_embd.weight", &[2880, 201088]), GgmlType::Q8_0);
        assert_eq!(m("blk.0.ffn_gate_inp.weight", &[2880, 32]), GgmlType::F32);
        assert_eq!(m("blk.0.ffn_up_exps.weight", &[100, 64, 32]), GgmlType::F16);
        assert_eq!(t(Quant::MXFP4, "blk.7.ffn_down.weight", &[14336, 4096]), GgmlType::Q8_0);
        assert_eq!(Quant::from_name("MXFP4"), Some(Quant::MXFP4));
        assert_eq!(
            [Quant::Q5_K_M, Quant::Q6_K, Quant::MXFP4].map(Quant::file_type),
            [17, 18, 38]
        );
    }

    #[test]
    fn fallback_table() {
        assert_eq!(fallback(GgmlType::Q4_K, 768), GgmlType::Q4_K);
        assert_eq!(fallback(GgmlType::Q4_K, 96), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::Q5_K, 96), GgmlType::Q5_1);
        assert_eq!(fallback(GgmlType::Q6_K, 96), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::Q6_K, 100), GgmlType::F16);
        assert_eq!(fallback(GgmlType::Q4_0, 100), GgmlType::F16);
        assert_eq!(fallback(GgmlType::IQ4_XS, 96), GgmlType::IQ4_NL);
    }

    #[test]
    fn half_conversions() {
        for (x, bits) in [
            (0.0f32, 0x0000u16),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (1e6, 0x7c00),
            (6.103_515_6e-5, 0x0400),
            (5.960_464_5e-8, 0x0001),
            (1e-9, 0x0000),
            (0.333_333_34, 0x3555),
        ] {
            assert_eq!(f32_to_f16(x), bits, "{x}");
        }
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        for h in [0x3c00u16, 0x0001, 0x03ff, 0x0400, 0x7bff, 0xc000, 0x3555] {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h);
        }
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(-2.0), 0xc000);
    }

    #[test]
    fn centred_nibbles() {
        let mut b: Vec<u8> = (0..=255).collect();
        center_nibbles(&mut b);
        for (i, &x) in b.iter().enumerate() {
            let (lo, hi) = (i & 15, i >> 4);
            let want = |n: usize| if n == 0 { 8 } else { n };
            assert_eq!(usize::from(x & 15), want(lo));
            assert_eq!(usize::from(x >> 4), want(hi));
        }
        let std = ((1..=7).map(|k| (k * k) as f32).sum::<f32>() * 2.0 / 16.0).sqrt();
        assert!((std - CENTERED_NIBBLE_STD).abs() < 1e-3);
    }

    #[test]
    fn k_scale_packing_round_trips() {
        let mut r = WyRand::new(3);
        for _ in 0..100 {
            let mut sc = [0u8; 8];
            let mut m = [0u8; 8];
            for j in 0..8 {
                sc[j] = r.range_u8(0, 63);
                m[j] = r.range_u8(0, 63);
            }
            let q = pack_scales_k4(&sc, &m);
            for j in 0..8 {
                assert_eq!(unpack_scale_min_k4(j, &q), (sc[j], m[j]));
            }
        }
    }

    /// Dequantizes blocks the way ggml does, to check statistics.
    fn dequant(ty: GgmlType, b: &[u8]) -> Vec<f32> {
        let f = |i: usize| f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]));
        match ty {
            GgmlType::Q4_0 => (0..32)
                .map(|j| {
                    let q = if j < 16 { b[2 + j] & 15 } else { b[2 + j - 16] >> 4 };
                    f(0) * (f32::from(q) - 8.0)
                })
                .collect(),
            GgmlType::Q8_0 => (0..32).map(|j| f(0) * f32::from(b[2 + j] as i8)).collect(),
            GgmlType::MXFP4 => {
                const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
                let scale = 2f32.powi(i32::from(b[0]) - 128);
                (0..32)
                    .map(|j| {
                        let q = if j < 16 { b[1 + j] & 15 } else { b[1 + j - 16] >> 4 };
                        scale * f32::from(KVALUES[usize::from(q)])
                    })
                    .collect()
            }
            GgmlType::Q4_K => {
                let (d, dmin) = (f(0), f(2));
                let mut sc = [0u8; 12];
                sc.copy_from_slice(&b[4..16]);
                let qs = &b[16..144];
                let mut out = Vec::new();
                for j in 0..8 {
                    let (s, m) = unpack_scale_min_k4(j, &sc);
                    for l in 0..32 {
                        let byte = qs[(j / 2) * 32 + l];
                        let q = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
                        out.push(d * f32::from(s) * f32::from(q) - dmin * f32::from(m));
                    }
                }
                out
            }
            GgmlType::Q6_K => {
                let d = f(208);
                let mut out = Vec::new();
                for i in 0..256 {
                    // exact bit layout does not matter for the statistics
                    let ql = b[i % 128];
                    let q = f32::from(if i < 128 { ql & 15 } else { ql >> 4 })
                        + 16.0 * f32::from((b[128 + i % 64] >> (2 * (i / 64))) & 3);
                    let s = f32::from(b[192 + i / 16] as i8);
                    out.push(d * s * (q - 32.0));
                }
                out
            }
            _ => unreachable!(),
        }
    }

    #[test]
    fn random_blocks_have_the_requested_spread() {
        let sigma = 0.02f32;
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::MXFP4,
        ] {
            let mut r = WyRand::new(7);
            let mut buf = vec![0u8; ty.type_size() as usize * 512];
            assert!(fill_blocks(ty, Init::Random { sigma }, &mut r, &mut buf));
            let vals: Vec<f32> = buf
                .chunks_exact(ty.type_size() as usize)
                .flat_map(|b| dequant(ty, b))
                .collect();
            let n = vals.len() as f32;
            let mean = vals.iter().sum::<f32>() / n;
            let std = (vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n).sqrt();
            assert!(vals.iter().all(|v| v.is_finite()));
            assert!(mean.abs() < sigma * 0.1, "{ty}: mean {mean}");
            assert!((std / sigma - 1.0).abs() < 0.2, "{ty}: std {std}");
        }
    }

    #[test]
    fn plain_types_and_constant_inits() {
        let mut r = WyRand::new(1);
        let mut buf = vec![0u8; 4 * 1000];
        assert!(fill_blocks(GgmlType::F32, Init::Ones, &mut r, &mut buf));
        assert!(buf.chunks_exact(4).all(|c| c == 1.0f32.to_le_bytes()));
        assert!(fill_blocks(GgmlType::F32, Init::Zeros, &mut r, &mut buf));
        assert!(buf.iter().all(|&b| b == 0));
        assert!(fill_blocks(
            GgmlType::F16,
            Init::Random { sigma: 0.1 },
            &mut r,
            &mut buf
        ));
        let vals: Vec<f32> = buf
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        assert!(vals.iter().all(|v| v.abs() <= 0.1 * 3f32.sqrt() * 1.001));
        assert!(!fill_blocks(GgmlType::Q4_0, Init::Ones, &mut r, &mut buf[..18]));
        assert!(!fill_blocks(GgmlType::IQ2_XXS, Init::Zeros, &mut r, &mut buf[..66]));
        assert!(!fill_blocks(GgmlType::Q4_0, Init::Zeros, &mut r, &mut buf[..17]));
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q5_K,
            GgmlType::BF16,
        ] {
            let mut b = vec![0u8; ty.type_size() as usize * 4];
            assert!(fill_blocks(ty, Init::Random { sigma: 0.1 }, &mut r, &mut b), "{ty}");
        }
    }
}
