//! A small seeded generator (splitmix64) for whatever must be reproducible from a seed: the
//! simulator's draws and the tests' workloads and interleavings. Not for secrets: its output
//! reveals its state.

/// splitmix64 (Steele, Lea and Flood): one 64-bit state, every seed a full-period stream.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose stream is fixed by `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `bound` (0 when `bound` is 0); the modulo's bias is negligible for the
    /// small bounds of workloads.
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next_u64() % bound
        }
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn the_stream_is_fixed_by_the_seed_and_draws_stay_in_range() {
        // The reference values of splitmix64 seeded with 0.
        let mut zero = SplitMix64::new(0);
        assert_eq!(zero.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(zero.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        let (mut a, mut b) = (SplitMix64::new(42), SplitMix64::new(42));
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            assert!(a.below(7) < 7 && b.below(7) < 7);
            let u = a.unit();
            assert!((0.0..1.0).contains(&u));
            b.unit();
        }
        assert_eq!(a.below(0), 0);
    }
}
