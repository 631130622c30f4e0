//! Property tests: share rounding, interval construction and monotone evaluation.

use mutirao_predict::interval::{from_samples, Interval};
use mutirao_predict::shares::{static_shares, static_total};
use proptest::prelude::*;

proptest! {
    /// The documented rounding: shares sum to ⌈f·c⌉, each is the quota's floor or ceiling,
    /// and a faster machine never gets fewer tasks.
    #[test]
    fn shares_sum_to_c(ws in prop::collection::vec(0.01f64..10.0, 1..64), c in 0u64..5000, f in prop_oneof![Just(1.0f64), 0.0f64..=1.0]) {
        let s = static_shares(&ws, c, f).unwrap();
        let total = static_total(c, f);
        prop_assert_eq!(s.iter().sum::<u64>(), total);
        let sum_w: f64 = ws.iter().sum();
        for (i, (&si, &wi)) in s.iter().zip(&ws).enumerate() {
            let q = total as f64 * wi / sum_w;
            prop_assert!(si as f64 >= q.floor() - 1e-6 && si as f64 <= q.ceil() + 1e-6, "i={} s={} q={}", i, si, q);
        }
        for i in 0..ws.len() {
            for j in 0..ws.len() {
                if ws[i] > ws[j] {
                    prop_assert!(s[i] >= s[j]);
                }
            }
        }
    }

    /// With f = 1 the shares always sum to exactly c.
    #[test]
    fn shares_f1_sum_exactly_c(ws in prop::collection::vec(0.001f64..1.0, 1..40), c in 0u64..100_000) {
        prop_assert_eq!(static_shares(&ws, c, 1.0).unwrap().iter().sum::<u64>(), c);
    }

    /// Huerta's interval is one of the candidate windows and the narrowest of them.
    #[test]
    fn huerta_is_narrowest_window(mut xs in prop::collection::vec(0.0f64..1000.0, 1..40), keep in 1.0f64..=100.0) {
        let iv = from_samples(&xs, keep).unwrap();
        xs.sort_by(f64::total_cmp);
        let n = xs.len();
        let d = (((100.0 - keep) * n as f64 / 100.0) + 1e-9).floor() as usize;
        let d = d.min(n - 1);
        let best = (0..=d).map(|i| xs[n - d + i - 1] - xs[i]).fold(f64::INFINITY, f64::min);
        prop_assert_eq!(iv.width(), best);
        prop_assert!(iv.lo <= iv.hi);
    }

    /// Monotone ops: evaluating on bounds equals interval arithmetic.
    #[test]
    fn monotone_ops(a in 0.0f64..10.0, b in 0.0f64..10.0, c in 0.0f64..10.0, d in 0.0f64..10.0, k in 0.0f64..100.0) {
        let x = Interval::new(a.min(b), a.max(b)).unwrap();
        let y = Interval::new(c.min(d), c.max(d)).unwrap();
        let r = (x + y).scale(k).unwrap().max(y);
        prop_assert_eq!(r.lo, ((x.lo + y.lo) * k).max(y.lo));
        prop_assert_eq!(r.hi, ((x.hi + y.hi) * k).max(y.hi));
    }
}

proptest! {
    /// Nested constant loops multiply: the innermost statement runs Π bounds times, and every
    /// loop level charges its init once per entry and its control ops once per iteration.
    #[test]
    fn analyser_nested_loops_multiply(bounds in prop::collection::vec(0u64..40, 1..4), step in 1u64..4) {
        use mutirao_predict::analyse::analyse;
        use mutirao_predict::analytic::Policy;
        let mut src = String::from("fn f() { let mut s: f64 = 0.0;\n");
        for (k, b) in bounds.iter().enumerate() {
            src.push_str(&format!("for i{k} in (0..{b}).step_by({step}) {{\n"));
        }
        src.push_str("s *= 2.0;\n");
        src.push_str(&"}\n".repeat(bounds.len()));
        src.push('}');
        let a = analyse(&src, "f", &[]).unwrap();
        let c = a.counts(Policy::Worst).unwrap();
        let trips: Vec<u64> = bounds.iter().map(|b| b.div_ceil(step)).collect();
        let inner: u64 = trips.iter().product();
        prop_assert_eq!(c.get("mpy_double").copied().unwrap_or(0.0), inner as f64);
        // Entries of loop level k = Π trips of the levels outside it.
        let mut entries = 1u64;
        let mut iterations = 0u64;
        for t in &trips {
            iterations += entries * t;
            entries *= t;
        }
        let entered: u64 = (0..trips.len()).map(|k| trips[..k].iter().product::<u64>()).sum();
        // compare: once per entry + once per iteration of every loop.
        prop_assert_eq!(c.get("compare").copied().unwrap_or(0.0), (entered + iterations) as f64);
        // sum_int: the increment, once per iteration.
        prop_assert_eq!(c.get("sum_int").copied().unwrap_or(0.0), iterations as f64);
    }

    /// A chain flow T1 → T2 → … → Tn reduces to 𝔹1; 𝔹2; …; 𝔹n.
    #[test]
    fn pasl_chain_is_sequential(n in 2usize..12, c in 1u64..500) {
        use mutirao_predict::pasl;
        let mut src = String::new();
        for i in 1..=n {
            src.push_str(&format!("B{i}=\"C{i}.class\";\n"));
        }
        src.push_str("%%\nT1=B1(1)<<NULL;\n");
        for i in 2..=n {
            let card = if i == n { 1 } else { c };
            src.push_str(&format!("T{i}=B{i}({card})<<T{};\n", i - 1));
        }
        let dag = pasl::parse(&src).unwrap().dag(&Default::default()).unwrap();
        let want: Vec<String> = (1..=n).map(|i| format!("B{i}")).collect();
        prop_assert_eq!(dag.series_parallel().unwrap().ascii(), want.join("; "));
    }
}
