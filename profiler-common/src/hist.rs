//! The log2 histograms of waits and holds: their buckets, and the bucket of a duration.

/// Number of log2 buckets per histogram. Bucket `i` holds durations `d` with
/// `2^(i-1) <= d < 2^i` nanoseconds (bucket 0 holds `d == 0`); the last bucket also takes
/// everything longer (2^38 ns is about 4.6 minutes).
pub const HIST_BUCKETS: usize = 40;

/// Log2 bucket index of a duration in nanoseconds (`64 - ns.leading_zeros()`, capped); see
/// [`HIST_BUCKETS`].
///
/// Written for the BPF side, where it runs twice per accumulated acquisition: BPF has no
/// count-leading-zeros instruction (LLVM expands `leading_zeros` into some forty
/// instructions), and a binary search with branches makes the verifier walk every
/// combination of them. This narrows the value to its top byte without branches (at each
/// step, the sign of `2^k - 1 - v` says whether `v >= 2^k`), then looks the byte up.
#[inline(always)]
pub fn bucket_index(ns: u64) -> usize {
    // Below 2^63 first (a halving counted in b), for the sign trick below.
    let top = ns >> 63;
    let mut v = ns >> top;
    let mut b = top;
    let mut step = |k: u64| {
        let ge = ((1u64 << k) - 1).wrapping_sub(v) >> 63;
        let shift = ge * k;
        v >>= shift;
        b += shift;
    };
    step(32);
    step(16);
    step(8);
    // v < 256 here.
    let idx = (b + BIT_LENGTH[(v & 0xff) as usize] as u64) as usize;
    if idx >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        idx
    }
}

/// The bit length of each byte value (0 for 0).
static BIT_LENGTH: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 1;
    while i < 256 {
        t[i] = (8 - (i as u8).leading_zeros()) as u8;
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    /// The binary search agrees with the definition, at every power of two and its
    /// neighbours, and on a spread of other values.
    #[test]
    fn bucket_index_is_the_capped_bit_length() {
        let by_definition = |ns: u64| ((64 - ns.leading_zeros()) as usize).min(HIST_BUCKETS - 1);
        let mut values = vec![0, 1, 2, 3, u64::MAX, (1 << 63) - 1];
        for i in 0..64 {
            let p = 1u64 << i;
            values.extend([p - 1, p, p + 1]);
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x >> (x % 64));
        }
        for v in values {
            assert_eq!(bucket_index(v), by_definition(v), "{v}");
        }
    }

    #[test]
    fn bucket_boundaries() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(1), 1);
        assert_eq!(bucket_index(2), 2);
        assert_eq!(bucket_index(3), 2);
        assert_eq!(bucket_index(4), 3);
        assert_eq!(bucket_index(1023), 10);
        assert_eq!(bucket_index(1024), 11);
        assert_eq!(bucket_index(u64::MAX), HIST_BUCKETS - 1);
        assert_eq!(bucket_index(1 << 38), HIST_BUCKETS - 1);
        assert_eq!(bucket_index((1 << 38) - 1), 38);
    }
}
