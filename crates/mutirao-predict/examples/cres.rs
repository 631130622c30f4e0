//! CRES on this host alone: time every basic operation × data type and print the machine model
//! in the thesis's Appendix-B format (`inter_<op>_<type>[INDEX]=[lo;hi]`, seconds per
//! operation), with the library's benchmarks (`mutirao_predict::cres`) and a wall clock.
//!
//! Run: `cargo run --release -p mutirao-predict --example cres -- [INDEX [NAME]]`
//! (INDEX defaults to 0, the coordinator; NAME to this host's name).
//!
//! For a whole group of hosts — op costs on the CPU clock scaled by each host's share of a
//! core, W and send costs through the runtime — use `mutirao predict machine` instead.

use mutirao_predict::cres::measure_ops;
use mutirao_predict::interval::from_samples;
use mutirao_predict::machine::{Machine, MachineModel};
use std::collections::BTreeMap;
use std::time::Instant;

const N: u64 = 1_000_000;
const K: usize = 15;
const KEEP_PERCENT: f64 = 80.0;

fn main() {
    let mut args = std::env::args().skip(1);
    let index: usize = match args.next().map(|s| s.parse()) {
        None => 0,
        Some(Ok(i)) => i,
        Some(Err(_)) => {
            eprintln!("usage: cres [INDEX [NAME]]  (INDEX is a machine index: 0 = coordinator)");
            std::process::exit(2);
        }
    };
    let name = args.next().or_else(|| {
        std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    });
    let started = Instant::now();
    let clock = move || started.elapsed().as_secs_f64();
    let mut costs = BTreeMap::new();
    for (key, samples) in measure_ops(N, K, &clock) {
        match from_samples(&samples, KEEP_PERCENT) {
            Ok(iv) => {
                costs.insert(key, iv);
            }
            Err(e) => eprintln!("{key}: no interval ({e})"),
        }
    }
    let mm = MachineModel {
        send_unit_s: 1e-3,
        machines: vec![Machine {
            index,
            name,
            w: None,
            costs,
        }],
        sends: Vec::new(),
    };
    print!("{}", mm.to_appendix_b());
    eprintln!(
        "cres: {} keys, {K} samples of {N} iterations each, C = {KEEP_PERCENT} %, in {:.1} s",
        mm.machines[0].costs.len(),
        started.elapsed().as_secs_f64()
    );
}
