//! ggml tensor types: numeric ids, block geometry and byte sizes.
//!
//! The ids and sizes mirror `enum ggml_type` and the `type_traits` table in
//! upstream `ggml/src/ggml.c` / `ggml-common.h`. Every size computation here
//! is overflow-checked so that hostile shapes read from a file cannot wrap.

use std::fmt;

/// A ggml tensor element type, with its on-disk numeric id.
///
/// Ids that upstream removed (4, 5, 31–33, 36–38) are deliberately absent:
/// a file using them is rejected as having an unknown type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE half float.
    F16,
    /// 4-bit, block of 32, one f16 scale.
    Q4_0,
    /// 4-bit, block of 32, f16 scale and min.
    Q4_1,
    /// 5-bit, block of 32, one f16 scale.
    Q5_0,
    /// 5-bit, block of 32, f16 scale and min.
    Q5_1,
    /// 8-bit, block of 32, one f16 scale.
    Q8_0,
    /// 8-bit, block of 32, f16 scale and sum (activations only).
    Q8_1,
    /// 2-bit k-quant, super-block of 256.
    Q2_K,
    /// 3-bit k-quant, super-block of 256.
    Q3_K,
    /// 4-bit k-quant, super-block of 256.
    Q4_K,
    /// 5-bit k-quant, super-block of 256.
    Q5_K,
    /// 6-bit k-quant, super-block of 256.
    Q6_K,
    /// 8-bit k-quant (activations only), super-block of 256.
    Q8_K,
    /// i-quant, 2.06 bits per weight.
    IQ2_XXS,
    /// i-quant, 2.31 bits per weight.
    IQ2_XS,
    /// i-quant, 3.06 bits per weight.
    IQ3_XXS,
    /// i-quant, 1.56 bits per weight.
    IQ1_S,
    /// Non-linear 4-bit, block of 32.
    IQ4_NL,
    /// i-quant, 3.44 bits per weight.
    IQ3_S,
    /// i-quant, 2.5 bits per weight.
    IQ2_S,
    /// Non-linear 4-bit, super-block of 256.
    IQ4_XS,
    /// 8-bit signed integer.
    I8,
    /// 16-bit signed integer.
    I16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// 64-bit IEEE float.
    F64,
    /// i-quant, 1.75 bits per weight.
    IQ1_M,
    /// bfloat16.
    BF16,
    /// Ternary, 1.69 bits per weight.
    TQ1_0,
    /// Ternary, 2.06 bits per weight.
    TQ2_0,
    /// Microscaling FP4, block of 32 with an E8M0 scale.
    MXFP4,
    /// NVIDIA FP4, block of 64 with four E4M3 scales.
    NVFP4,
    /// 1-bit, block of 128.
    Q1_0,
    /// 2-bit, block of 64.
    Q2_0,
}

/// Static description of one type: id, name, block size, bytes per block,
/// and whether ggml considers it quantized.
struct Traits {
    id: u32,
    name: &'static str,
    block: u64,
    bytes: u64,
    quantized: bool,
}

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 35] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
    ];

    fn traits(self) -> Traits {
        use GgmlType::*;
        const K: u64 = 256; // QK_K
        let (id, name, block, bytes, quantized) = match self {
            F32 => (0, "f32", 1, 4, false),
            F16 => (1, "f16", 1, 2, false),
            Q4_0 => (2, "q4_0", 32, 2 + 16, true),
            Q4_1 => (3, "q4_1", 32, 2 * 2 + 16, true),
            Q5_0 => (6, "q5_0", 32, 2 + 4 + 16, true),
            Q5_1 => (7, "q5_1", 32, 2 * 2 + 4 + 16, true),
            Q8_0 => (8, "q8_0", 32, 2 + 32, true),
            Q8_1 => (9, "q8_1", 32, 2 * 2 + 32, true),
            Q2_K => (10, "q2_K", K, 2 * 2 + K / 16 + K / 4, true),
            Q3_K => (11, "q3_K", K, 2 + K / 4 + K / 8 + 12, true),
            Q4_K => (12, "q4_K", K, 2 * 2 + 12 + K / 2, true),
            Q5_K => (13, "q5_K", K, 2 * 2 + 12 + K / 2 + K / 8, true),
            Q6_K => (14, "q6_K", K, 2 + K / 16 + 3 * K / 4, true),
            Q8_K => (15, "q8_K", K, 4 + K + K / 16 * 2, true),
            IQ2_XXS => (16, "iq2_xxs", K, 2 + K / 8 * 2, true),
            IQ2_XS => (17, "iq2_xs", K, 2 + K / 8 * 2 + K / 32, true),
            IQ3_XXS => (18, "iq3_xxs", K, 2 + 3 * (K / 8), true),
            IQ1_S => (19, "iq1_s", K, 2 + K / 8 + K / 16, true),
            IQ4_NL => (20, "iq4_nl", 32, 2 + 16, true),
            IQ3_S => (21, "iq3_s", K, 2 + 13 * (K / 32) + K / 64, true),
            IQ2_S => (22, "iq2_s", K, 2 + K / 4 + K / 16, true),
            IQ4_XS => (23, "iq4_xs", K, 2 + 2 + K / 64 + K / 2, true),
            I8 => (24, "i8", 1, 1, false),
            I16 => (25, "i16", 1, 2, false),
            I32 => (26, "i32", 1, 4, false),
            I64 => (27, "i64", 1, 8, false),
            F64 => (28, "f64", 1, 8, false),
            IQ1_M => (29, "iq1_m", K, K / 8 + K / 16 + K / 32, true),
            BF16 => (30, "bf16", 1, 2, false),
            TQ1_0 => (34, "tq1_0", K, 2 + K / 64 + (K - 4 * K / 64) / 5, true),
            TQ2_0 => (35, "tq2_0", K, 2 + K / 4, true),
            MXFP4 => (39, "mxfp4", 32, 1 + 16, true),
            NVFP4 => (40, "nvfp4", 64, 64 / 16 + 64 / 2, true),
            Q1_0 => (41, "q1_0", 128, 2 + 128 / 8, true),
            Q2_0 => (42, "q2_0", 64, 2 + 64 / 4, true),
        };
        Traits {
            id,
            name,
            block,
            bytes,
            quantized,
        }
    }

    /// Looks a type up by its on-disk id; `None` for unknown or removed ids.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// Looks a type up by its ggml name (`"q4_K"`, `"f16"`, …), ignoring case.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// The on-disk numeric id (`GGML_TYPE_*`).
    pub fn id(self) -> u32 {
        self.traits().id
    }

    /// The ggml name, as printed by llama.cpp (`"q4_K"`, `"bf16"`, …).
    pub fn name(self) -> &'static str {
        self.traits().name
    }

    /// Number of elements in one block (1 for plain scalar types).
    pub fn block_size(self) -> u64 {
        self.traits().block
    }

    /// Bytes taken by one block.
    pub fn type_size(self) -> u64 {
        self.traits().bytes
    }

    /// Whether ggml treats the type as quantized (`ggml_is_quantized`).
    pub fn is_quantized(self) -> bool {
        self.traits().quantized
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a tensor size could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// The row length is not a whole number of blocks of the type.
    #[error("row length {ne0} is not a multiple of the {ty} block size {block}")]
    NotBlockMultiple {
        /// The tensor type.
        ty: GgmlType,
        /// The offending row length.
        ne0: u64,
        /// The type's block size.
        block: u64,
    },
    /// The byte size does not fit in 64 bits.
    #[error("tensor size overflows 64 bits")]
    Overflow,
    /// A tensor needs between 1 and 4 dimensions.
    #[error("a tensor needs 1 to 4 dimensions, got {0}")]
    BadRank(usize),
}

/// Bytes taken by one row of `ne0` elements of type `ty`
/// (`ggml_row_size`), checking that `ne0` is a whole number of blocks.
pub fn row_size(ty: GgmlType, ne0: u64) -> Result<u64, SizeError> {
    let block = ty.block_size();
    if ne0 % block != 0 {
        return Err(SizeError::NotBlockMultiple { ty, ne0, block });
    }
    (ne0 / block).checked_mul(ty.type_size()).ok_or(SizeError::Overflow)
}

/// Exact bytes taken by a contiguous tensor of type `ty` and shape `dims`
/// (`ggml_nbytes`; `dims[0]` is the row length, ggml's `ne[0]`).
pub fn nbytes(ty: GgmlType, dims: &[u64]) -> Result<u64, SizeError> {
    if dims.is_empty() || dims.len() > 4 {
        return Err(SizeError::BadRank(dims.len()));
    }
    let mut size = row_size(ty, dims[0])?;
    for &d in &dims[1..] {
        size = size.checked_mul(d).ok_or(SizeError::Overflow)?;
    }
    Ok(size)
}

/// Number of elements of a tensor of shape `dims`, overflow-checked.
pub fn n_elements(dims: &[u64]) -> Result<u64, SizeError> {
    dims.iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or(SizeError::Overflow)
}

/// Row padding applied by ggml-cuda to quantized matrices
/// (`MATRIX_ROW_PADDING` in `ggml-cuda/common.cuh`).
pub const CUDA_MATRIX_ROW_PADDING: u64 = 512;

/// Bytes that ggml-cuda allocates for a weight tensor of type `ty` and shape
/// `dims`.
///
/// This mirrors `ggml_backend_cuda_buffer_type_get_alloc_size`: quantized
/// tensors whose row length is not a multiple of 512 get room for one more
/// partial row (`ggml_row_size(type, 512 - ne0 % 512)`) so that the matmul
/// kernels can read past the last row. Non-quantized types (F32, F16, BF16,
/// integers) are never padded.
pub fn cuda_alloc_size(ty: GgmlType, dims: &[u64]) -> Result<u64, SizeError> {
    let size = nbytes(ty, dims)?;
    let ne0 = dims[0];
    if ty.is_quantized() && ne0 % CUDA_MATRIX_ROW_PADDING != 0 {
        // ggml_row_size is `type_size * ne / blck_size`; the padding length
        // is a block multiple for every row length that passed `nbytes`.
        let pad_elems = CUDA_MATRIX_ROW_PADDING - ne0 % CUDA_MATRIX_ROW_PADDING;
        let pad = ty.type_size().checked_mul(pad_elems).ok_or(SizeError::Overflow)? / ty.block_size();
        return size.checked_add(pad).ok_or(SizeError::Overflow);
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for t in GgmlType::ALL {
            assert!(seen.insert(t.id()), "duplicate id {}", t.id());
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn ids_match_ggml() {
        use GgmlType::*;
        let expected = [
            (F32, 0),
            (F16, 1),
            (Q4_0, 2),
            (Q4_1, 3),
            (Q5_0, 6),
            (Q5_1, 7),
            (Q8_0, 8),
            (Q8_1, 9),
            (Q2_K, 10),
            (Q3_K, 11),
            (Q4_K, 12),
            (Q5_K, 13),
            (Q6_K, 14),
            (Q8_K, 15),
            (IQ2_XXS, 16),
            (IQ2_XS, 17),
            (IQ3_XXS, 18),
            (IQ1_S, 19),
            (IQ4_NL, 20),
            (IQ3_S, 21),
            (IQ2_S, 22),
            (IQ4_XS, 23),
            (I8, 24),
            (I16, 25),
            (I32, 26),
            (I64, 27),
            (F64, 28),
            (IQ1_M, 29),
            (BF16, 30),
            (TQ1_0, 34),
            (TQ2_0, 35),
            (MXFP4, 39),
        ];
        for (t, id) in expected {
            assert_eq!(t.id(), id, "{t}");
        }
    }

    #[test]
    fn block_sizes_match_ggml() {
        use GgmlType::*;
        // (type, block size, bytes per block) from the static_asserts in ggml-common.h
        let expected = [
            (F32, 1, 4),
            (F16, 1, 2),
            (BF16, 1, 2),
            (Q4_0, 32, 18),
            (Q4_1, 32, 20),
            (Q5_0, 32, 22),
            (Q5_1, 32, 24),
            (Q8_0, 32, 34),
            (Q8_1, 32, 36),
            (Q2_K, 256, 84),
            (Q3_K, 256, 110),
            (Q4_K, 256, 144),
            (Q5_K, 256, 176),
            (Q6_K, 256, 210),
            (Q8_K, 256, 292),
            (IQ2_XXS, 256, 66),
            (IQ2_XS, 256, 74),
            (IQ3_XXS, 256, 98),
            (IQ1_S, 256, 50),
            (IQ4_NL, 32, 18),
            (IQ3_S, 256, 110),
            (IQ2_S, 256, 82),
            (IQ4_XS, 256, 136),
            (IQ1_M, 256, 56),
            (TQ1_0, 256, 54),
            (TQ2_0, 256, 66),
            (MXFP4, 32, 17),
            (NVFP4, 64, 36),
            (Q1_0, 128, 18),
            (Q2_0, 64, 18),
            (I8, 1, 1),
            (I16, 1, 2),
            (I32, 1, 4),
            (I64, 1, 8),
            (F64, 1, 8),
        ];
        for (t, block, bytes) in expected {
            assert_eq!((t.block_size(), t.type_size()), (block, bytes), "{t}");
        }
    }

    #[test]
    fn row_and_tensor_sizes() {
        assert_eq!(row_size(GgmlType::Q4_0, 4096), Ok(4096 / 32 * 18));
        assert_eq!(row_size(GgmlType::Q4_K, 4096), Ok(16 * 144));
        assert_eq!(
            row_size(GgmlType::Q4_K, 100),
            Err(SizeError::NotBlockMultiple {
                ty: GgmlType::Q4_K,
                ne0: 100,
                block: 256
            })
        );
        assert_eq!(nbytes(GgmlType::F32, &[4096]), Ok(16384));
        assert_eq!(nbytes(GgmlType::Q8_0, &[4096, 14336]), Ok(4096 / 32 * 34 * 14336));
        assert_eq!(nbytes(GgmlType::F32, &[]), Err(SizeError::BadRank(0)));
        assert_eq!(nbytes(GgmlType::F32, &[1, 1, 1, 1, 1]), Err(SizeError::BadRank(5)));
        assert_eq!(nbytes(GgmlType::F32, &[1 << 40, 1 << 40]), Err(SizeError::Overflow));
        assert_eq!(nbytes(GgmlType::F64, &[u64::MAX]), Err(SizeError::Overflow));
        assert_eq!(n_elements(&[2, 3, 4]), Ok(24));
        assert_eq!(n_elements(&[u64::MAX, 2]), Err(SizeError::Overflow));
    }

    #[test]
    fn cuda_padding_rule() {
        // multiple of 512: no padding
        assert_eq!(
            cuda_alloc_size(GgmlType::Q4_0, &[4096, 10]),
            nbytes(GgmlType::Q4_0, &[4096, 10])
        );
        // 14336 % 512 == 0 as well
        assert_eq!(
            cuda_alloc_size(GgmlType::Q4_K, &[14336, 4096]),
            nbytes(GgmlType::Q4_K, &[14336, 4096])
        );
        // 768 % 512 == 256: one extra half row of 256 elements
        let base = nbytes(GgmlType::Q4_K, &[768, 2048, 128]).unwrap();
        assert_eq!(cuda_alloc_size(GgmlType::Q4_K, &[768, 2048, 128]), Ok(base + 144));
        // 3584 % 512 == 0
        assert_eq!(
            cuda_alloc_size(GgmlType::Q8_0, &[3584, 512]),
            nbytes(GgmlType::Q8_0, &[3584, 512])
        );
        // 18944 % 512 == 512*37 = 18944 -> 0; pick 18976 (= 18944 + 32)
        let base = nbytes(GgmlType::Q8_0, &[18976, 2]).unwrap();
        assert_eq!(
            cuda_alloc_size(GgmlType::Q8_0, &[18976, 2]),
            Ok(base + (512 - 32) / 32 * 34)
        );
        // unquantized types are never padded
        for t in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            assert_eq!(cuda_alloc_size(t, &[100, 3]), nbytes(t, &[100, 3]));
        }
    }
}
