//! Fuzz the rank-to-rank wire decoders: any byte string must decode to a value or an error,
//! never a panic, and whatever decodes must re-encode to the same bytes.
//!
//!     cargo install cargo-fuzz && cargo +nightly fuzz run wire_decode
//!
//! (The same property runs on stable in CI as the proptest `wire::tests::decode_never_panics`.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use mutirao::wire::{Header, Hello, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::decode(data) {
        assert_eq!(&h.encode()[..], &data[..HEADER_LEN]);
    }
    let token = [7u8; 32];
    if let Ok(h) = Hello::decode_checked(data, &token, 64) {
        assert!(h.rank < 64);
    }
});
