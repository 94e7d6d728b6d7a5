//! A tiny, fast, seedable PRNG (wyrand) for synthetic weights.
//!
//! Not cryptographic; chosen for speed (one multiply per 8 random bytes) and
//! for reproducibility: the same seed always yields the same file.

/// wyrand generator state.
#[derive(Debug, Clone)]
pub struct WyRand(u64);

impl WyRand {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> WyRand {
        WyRand(seed)
    }

    /// A generator for one independent stream, derived from a base seed and
    /// two stream coordinates (e.g. tensor index and chunk index).
    pub fn for_stream(seed: u64, a: u64, b: u64) -> WyRand {
        let mut r = WyRand(seed ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let x = r.next_u64() ^ b.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        WyRand(x)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// A uniform float in `[0, 1)`.
    #[inline]
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// A uniform integer in `[lo, hi]` (inclusive; `lo <= hi`).
    #[inline]
    pub fn range_u8(&mut self, lo: u8, hi: u8) -> u8 {
        let span = u64::from(hi - lo) + 1;
        lo + (((self.next_u64() >> 32) * span) >> 32) as u8
    }

    /// Fills `out` with random bytes.
    #[inline]
    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let b = self.next_u64().to_le_bytes();
            rest.copy_from_slice(&b[..rest.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_spread() {
        let mut a = WyRand::new(1);
        let mut b = WyRand::new(1);
        assert_eq!(a.next_u64(), b.next_u64());
        assert_ne!(
            WyRand::for_stream(1, 2, 3).next_u64(),
            WyRand::for_stream(1, 2, 4).next_u64()
        );
        let mut r = WyRand::new(42);
        let mut hist = [0u32; 16];
        for _ in 0..16_000 {
            hist[(r.next_u64() & 15) as usize] += 1;
        }
        assert!(hist.iter().all(|&h| (800..1200).contains(&h)), "{hist:?}");
        for _ in 0..1000 {
            let x = r.range_u8(24, 40);
            assert!((24..=40).contains(&x));
            let f = r.next_f32();
            assert!((0.0..1.0).contains(&f));
        }
        let mut buf = [0u8; 13];
        r.fill_bytes(&mut buf);
        assert!(buf.iter().any(|&x| x != 0));
    }
}
