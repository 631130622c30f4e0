//! The straightforward flow network that `mutirao_sched::net::Network` replaced, kept as the
//! reference the equivalence tests compare against: every start and every finish recomputes
//! every rate (progressive filling, one resource at a time), every step scans every flow.

use mutirao_sched::net::{Capacities, Done, FlowNetwork, Path};
use std::collections::{HashMap, VecDeque};

/// The reference: progressive filling over all flows at every event.
pub struct Reference {
    caps: Capacities,
    now: f64,
    active: Vec<RefFlow>,
    waiting: HashMap<(usize, usize), VecDeque<RefFlow>>,
}

#[derive(Clone)]
struct RefFlow {
    key: usize,
    conn: (usize, usize),
    path: Path,
    start: f64,
    bytes: f64,
    left: f64,
    rate: f64,
    alone: f64,
}

impl Reference {
    pub fn new(caps: Capacities) -> Self {
        Reference {
            caps,
            now: 0.0,
            active: Vec::new(),
            waiting: HashMap::new(),
        }
    }

    fn advance(&mut self, t: f64) {
        let dt = t - self.now;
        if dt > 0.0 {
            for f in &mut self.active {
                f.left = (f.left - f.rate * dt).max(0.0);
            }
            self.now = t;
        }
    }

    fn start(&mut self, key: usize, src: usize, dst: usize, bytes: u64, at: f64) {
        self.advance(at);
        let Some(path) = self.caps.path(src, dst) else {
            return;
        };
        let b = self.caps.bottleneck(&path);
        let f = RefFlow {
            key,
            conn: (src, dst),
            path,
            start: at,
            bytes: bytes as f64,
            left: bytes as f64,
            rate: 0.0,
            alone: if b.is_finite() && b > 0.0 {
                bytes as f64 / b
            } else {
                0.0
            },
        };
        if self.active.iter().any(|a| a.conn == f.conn) {
            self.waiting.entry(f.conn).or_default().push_back(f);
        } else {
            self.active.push(f);
            self.rates();
        }
    }

    fn next_finish(&self) -> Option<f64> {
        self.active
            .iter()
            .map(|f| {
                if f.left <= 0.0 || f.rate.is_infinite() {
                    self.now
                } else if f.rate > 0.0 {
                    self.now + f.left / f.rate
                } else {
                    f64::INFINITY
                }
            })
            .min_by(f64::total_cmp)
    }

    fn finish_until(&mut self, t: f64, out: &mut Vec<Done>) {
        self.advance(t);
        let mut i = 0;
        let mut any = false;
        while i < self.active.len() {
            let f = &self.active[i];
            if f.left <= f.bytes * 1e-12 || f.rate.is_infinite() || f.left / f.rate < 1e-9 {
                let f = self.active.swap_remove(i);
                out.push(Done {
                    key: f.key,
                    at: self.now,
                    delay: (self.now - f.start - f.alone).max(0.0),
                });
                if let Some(next) = self.waiting.get_mut(&f.conn).and_then(VecDeque::pop_front) {
                    self.active.push(next);
                }
                any = true;
            } else {
                i += 1;
            }
        }
        if any {
            self.rates();
        }
    }

    /// Progressive filling, one resource at a time, the plain way.
    fn rates(&mut self) {
        let r = self.caps.resources();
        let mut cap: Vec<f64> = (0..r).map(|i| self.caps.capacity(i)).collect();
        let mut fixed = vec![false; self.active.len()];
        loop {
            let mut users = vec![0u32; r];
            for (i, f) in self.active.iter().enumerate() {
                if !fixed[i] {
                    for &q in f.path.ids() {
                        users[q] += 1;
                    }
                }
            }
            let best = (0..r)
                .filter(|&q| users[q] > 0 && cap[q].is_finite())
                .map(|q| (cap[q] / users[q] as f64, q))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            let Some((share, q)) = best else { break };
            for (f, done) in self.active.iter_mut().zip(fixed.iter_mut()) {
                if !*done && f.path.ids().contains(&q) {
                    *done = true;
                    f.rate = share.max(0.0);
                    for &p in f.path.ids() {
                        cap[p] -= share;
                    }
                }
            }
        }
        for (i, f) in self.active.iter_mut().enumerate() {
            if !fixed[i] {
                f.rate = f64::INFINITY;
            }
        }
    }
}

impl FlowNetwork for Reference {
    fn start(&mut self, key: usize, src: usize, dst: usize, bytes: u64, at: f64) {
        Reference::start(self, key, src, dst, bytes, at)
    }
    fn next_finish(&mut self) -> Option<f64> {
        Reference::next_finish(self)
    }
    fn finish_until(&mut self, t: f64, out: &mut Vec<Done>) {
        Reference::finish_until(self, t, out)
    }
}
