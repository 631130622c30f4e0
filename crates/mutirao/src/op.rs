//! Reduction operators for [`reduce`](crate::Comm::reduce) and
//! [`allreduce`](crate::Comm::allreduce).
//!
//! Built-ins: [`Sum`], [`Prod`], [`Max`], [`Min`] for every primitive number type. A user
//! operator is any closure `Fn(&[T], &mut [T])` wrapped in [`UserOp`]; it must compute
//! `inout[i] = input[i] ⊕ inout[i]` where `input` comes from lower ranks than `inout`, and be
//! associative. Mark it [`UserOp::non_commutative`] when `⊕` is not commutative: the collectives
//! then combine strictly in rank order.
//!
//! ```
//! use mutirao::op::{Op, Sum, UserOp};
//! let mut acc = [1i32, 2];
//! Sum.combine(&[10, 20], &mut acc);
//! assert_eq!(acc, [11, 22]);
//! let longest = UserOp::new(|a: &[u32], b: &mut [u32]| {
//!     for (x, y) in a.iter().zip(b.iter_mut()) { *y = (*y).max(*x) }
//! });
//! let mut acc = [3u32];
//! longest.combine(&[5], &mut acc);
//! assert_eq!(acc, [5]);
//! ```

/// A reduction operator on slices of `T`.
pub trait Op<T> {
    /// `inout[i] = input[i] ⊕ inout[i]`; `input` holds the contribution of lower ranks.
    fn combine(&self, input: &[T], inout: &mut [T]);
    /// Whether `a ⊕ b == b ⊕ a` (enables reordering algorithms).
    fn commutative(&self) -> bool {
        true
    }
}

/// Numbers the built-in operators apply to.
pub trait Number: bytemuck::Pod + PartialOrd {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
}

macro_rules! number {
    (int: $($t:ty),*) => {$(
        impl Number for $t {
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
        }
    )*};
    (float: $($t:ty),*) => {$(
        impl Number for $t {
            fn add(self, o: Self) -> Self { self + o }
            fn mul(self, o: Self) -> Self { self * o }
        }
    )*};
}
number!(int: i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize);
number!(float: f32, f64);

/// Sum (wrapping for integers).
pub struct Sum;
/// Product (wrapping for integers).
pub struct Prod;
/// Maximum.
pub struct Max;
/// Minimum.
pub struct Min;

impl<T: Number> Op<T> for Sum {
    fn combine(&self, input: &[T], inout: &mut [T]) {
        for (a, b) in input.iter().zip(inout.iter_mut()) {
            *b = a.add(*b);
        }
    }
}

impl<T: Number> Op<T> for Prod {
    fn combine(&self, input: &[T], inout: &mut [T]) {
        for (a, b) in input.iter().zip(inout.iter_mut()) {
            *b = a.mul(*b);
        }
    }
}

impl<T: Number> Op<T> for Max {
    fn combine(&self, input: &[T], inout: &mut [T]) {
        for (a, b) in input.iter().zip(inout.iter_mut()) {
            if *a > *b {
                *b = *a;
            }
        }
    }
}

impl<T: Number> Op<T> for Min {
    fn combine(&self, input: &[T], inout: &mut [T]) {
        for (a, b) in input.iter().zip(inout.iter_mut()) {
            if *a < *b {
                *b = *a;
            }
        }
    }
}

/// A user-defined operator from a closure.
pub struct UserOp<F> {
    f: F,
    commutative: bool,
}

impl<F> UserOp<F> {
    /// A commutative, associative operator.
    pub fn new(f: F) -> Self {
        UserOp {
            f,
            commutative: true,
        }
    }

    /// Declare the operator non-commutative: it is then applied strictly in rank order.
    pub fn non_commutative(mut self) -> Self {
        self.commutative = false;
        self
    }
}

impl<T, F: Fn(&[T], &mut [T])> Op<T> for UserOp<F> {
    fn combine(&self, input: &[T], inout: &mut [T]) {
        (self.f)(input, inout)
    }
    fn commutative(&self) -> bool {
        self.commutative
    }
}
