//! Frame buffers in power-of-two size classes (digest 002 §7.3), pure bookkeeping.
//!
//! A frame of `x` payload bytes and `ctrl` header bytes goes in a buffer of class `y`, the
//! smallest with `2^(y−1) < x + ctrl ≤ 2^y` (totals at or below the smallest class use the
//! smallest class). Buffers of finished sends and receives come back to their class's free list
//! and are reused, so steady traffic allocates nothing. Frames above the largest class get a
//! buffer of exactly their size that is not kept: the runtime carries them as one message (its
//! rendezvous path), so they arrive whole.

/// Smallest class: 2^6 = 64 bytes.
pub const MIN_CLASS: u8 = 6;
/// Buffers kept per class at most (the rest are freed).
pub const KEEP_PER_CLASS: usize = 64;

/// The class of a frame of `total` bytes (`x + ctrl`), or `None` above `max_class`.
pub fn class_of(total: usize, max_class: u8) -> Option<u8> {
    let y = total.max(1).next_power_of_two().trailing_zeros() as u8;
    let y = y.max(MIN_CLASS);
    (y <= max_class).then_some(y)
}

/// Free lists of frame buffers per class.
#[derive(Debug)]
pub struct Pool {
    max_class: u8,
    free: Vec<Vec<Vec<u8>>>,
    reused: u64,
    allocated: u64,
}

impl Pool {
    /// A pool whose largest class holds `max_bytes` (a power of two ≥ 64).
    pub fn new(max_bytes: usize) -> Result<Pool, String> {
        if max_bytes < 1 << MIN_CLASS || !max_bytes.is_power_of_two() || max_bytes > 1 << 30 {
            return Err(format!(
                "largest buffer class {max_bytes} must be a power of two between 64 and 2^30"
            ));
        }
        let max_class = max_bytes.trailing_zeros() as u8;
        Ok(Pool {
            max_class,
            free: vec![Vec::new(); usize::from(max_class) + 1],
            reused: 0,
            allocated: 0,
        })
    }

    /// Largest class (log2 of its size).
    pub fn max_class(&self) -> u8 {
        self.max_class
    }

    /// An empty buffer with room for `total` bytes: a class buffer (capacity `2^y`) or, above
    /// the largest class, an unpooled one of exactly `total`.
    pub fn take(&mut self, total: usize) -> Vec<u8> {
        match class_of(total, self.max_class) {
            Some(y) => match self.free[usize::from(y)].pop() {
                Some(mut b) => {
                    self.reused += 1;
                    b.clear();
                    b
                }
                None => {
                    self.allocated += 1;
                    Vec::with_capacity(1 << y)
                }
            },
            None => {
                self.allocated += 1;
                Vec::with_capacity(total)
            }
        }
    }

    /// Gives a buffer back: kept if its capacity is exactly a class size and the class's free
    /// list is not full, freed otherwise.
    pub fn give(&mut self, b: Vec<u8>) {
        let cap = b.capacity();
        if !cap.is_power_of_two() {
            return;
        }
        let y = cap.trailing_zeros() as u8;
        if (MIN_CLASS..=self.max_class).contains(&y)
            && self.free[usize::from(y)].len() < KEEP_PER_CLASS
        {
            self.free[usize::from(y)].push(b);
        }
    }

    /// Buffers served from a free list so far.
    pub fn reused(&self) -> u64 {
        self.reused
    }

    /// Buffers allocated so far.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn class_boundaries() {
        assert_eq!(class_of(1, 16), Some(6));
        assert_eq!(class_of(64, 16), Some(6));
        assert_eq!(class_of(65, 16), Some(7));
        assert_eq!(class_of(128, 16), Some(7));
        assert_eq!(class_of(65536, 16), Some(16));
        assert_eq!(class_of(65537, 16), None);
    }

    #[test]
    fn buffers_come_back_to_their_class() {
        let mut p = Pool::new(1 << 16).unwrap();
        let b = p.take(100);
        assert_eq!(b.capacity(), 128);
        p.give(b);
        let b = p.take(120);
        assert_eq!((p.reused(), p.allocated()), (1, 1));
        assert_eq!(b.capacity(), 128);
        let big = p.take(70_000);
        assert!(big.capacity() >= 70_000);
        p.give(big); // not a class size: freed
        assert_eq!(p.take(70_000).capacity(), 70_000);
        assert_eq!(p.reused(), 1);
        assert!(Pool::new(100).is_err());
        assert!(Pool::new(32).is_err());
    }

    proptest! {
        /// The thesis's rule: 2^(y−1) < x + ctrl ≤ 2^y above the smallest class.
        #[test]
        fn size_class_rule(x in 0usize..200_000, ctrl in 0usize..200, max in 6u8..20) {
            let total = x + ctrl;
            match class_of(total, max) {
                Some(y) => {
                    prop_assert!(total <= 1 << y);
                    prop_assert!(y == MIN_CLASS || (1usize << (y - 1)) < total);
                    prop_assert!(y <= max);
                }
                None => prop_assert!(total > 1 << max),
            }
        }
    }
}
