//! Environment variables that tune the runtime. Every one has a sane default.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `MUTIRAO_EAGER_LIMIT` | 65536 | messages to TCP peers up to this many bytes are sent at once; larger ones by rendezvous (set explicitly, it applies to shared-memory peers too unless `MUTIRAO_SHM_EAGER_LIMIT` is set) |
//! | `MUTIRAO_SHM_EAGER_LIMIT` | the ring size (`MUTIRAO_SHM_RING`, 2 MiB) | the same for shared-memory peers: streaming through the ring beat the single-copy rendezvous (`MUTIRAO_CMA`) at every size up to 2 MiB on the development VM (one-way 1 MiB 49–54 µs against 101–126 µs) |
//! | `MUTIRAO_SPIN_US` | 50 with TCP peers, 500 when every peer shares memory, 0 when ranks outnumber cores | how long a waiting rank polls before sleeping (with TCP peers on a busy machine, more threads runnable than CPUs, it sleeps at once) |
//! | `MUTIRAO_YIELD_US` | 1000 when ranks outnumber cores, else 0 | after spinning, how long a waiting rank keeps yielding its core (cheap hand-over to a co-located rank) before sleeping |
//! | `MUTIRAO_POLITE_YIELD_US` | 0 | while spinning, offer the core (`sched_yield`) this often; 0: never (see `engine::POLITE_YIELD`) |
//! | `MUTIRAO_TRANSPORT` | `auto` | `auto`: shared memory to ranks of the same host, TCP otherwise; `tcp`: TCP only |
//! | `MUTIRAO_CMA` | 1 | same-host large messages are copied once, straight from the sender's memory (`process_vm_readv`); 0 streams them through the ring |
//! | `MUTIRAO_SHM_RING` | 2097152 | bytes of each shared-memory ring (one per direction per local peer) |
//! | `MUTIRAO_SHM_PREFAULT` | 0 | 1: touch every page of every ring at start-up, so the first trip around a ring pays no page faults (a 32 KiB message: 3–7 µs instead of 30–80 µs until the ring wraps); costs start-up time (2 ranks +2 ms, 8 ranks +60 ms on the 2-core VM) |
//! | `MUTIRAO_CONNECT_TIMEOUT_S` | 60 | how long start-up waits for the launcher and the peers |

use std::time::Duration;

fn env_usize(name: &str) -> Result<Option<usize>, String> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| format!("{name}={v:?} is not a non-negative integer")),
        Err(_) => Ok(None),
    }
}

/// The eager limit towards TCP peers when `MUTIRAO_EAGER_LIMIT` is not set, bytes.
pub const DEFAULT_EAGER_LIMIT: usize = 64 * 1024;

/// Settings read from the environment.
#[derive(Debug, Clone)]
pub struct Config {
    pub eager_limit: usize,
    /// Eager limit towards shared-memory peers.
    pub shm_eager_limit: usize,
    pub spin: Duration,
    /// Spin when every peer is on shared memory (a large copy by the peer is worth waiting for).
    pub spin_shm: Duration,
    /// After spinning, yield the core this long before sleeping (oversubscribed hosts).
    pub yield_for: Duration,
    /// While spinning, offer the core this often (`MUTIRAO_POLITE_YIELD_US`; zero: never).
    pub polite_yield: Duration,
    pub shm: bool,
    pub cma: bool,
    pub shm_ring: usize,
    /// Touch every ring page at start-up (`MUTIRAO_SHM_PREFAULT`).
    pub shm_prefault: bool,
    pub connect_timeout: Duration,
    /// More ranks on this host than cores: a copy made by one rank is a copy no other rank
    /// makes meanwhile, so single copies (cross-memory) beat streaming through a ring.
    pub outnumbered: bool,
}

impl Config {
    /// Read the environment; `local_ranks` is the number of ranks sharing this host.
    pub fn from_env(local_ranks: usize) -> Result<Config, String> {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let oversubscribed = local_ranks > cores;
        // Oversubscribed: no spinning at all — yield the core at once (see MUTIRAO_YIELD_US).
        let default_spin = if oversubscribed { 0 } else { 50 };
        let default_spin_shm = if oversubscribed { 0 } else { 500 };
        let spin_env = env_usize("MUTIRAO_SPIN_US")?;
        let transport = std::env::var("MUTIRAO_TRANSPORT").unwrap_or_else(|_| "auto".into());
        let shm = match transport.as_str() {
            "auto" | "shm" => true,
            "tcp" => false,
            other => {
                return Err(format!(
                    "MUTIRAO_TRANSPORT={other:?}: expected \"auto\" or \"tcp\""
                ))
            }
        };
        let eager = env_usize("MUTIRAO_EAGER_LIMIT")?;
        let shm_ring = env_usize("MUTIRAO_SHM_RING")?
            .unwrap_or(2 << 20)
            .clamp(4096, 1 << 30);
        let cma = env_usize("MUTIRAO_CMA")?.unwrap_or(1) != 0;
        Ok(Config {
            eager_limit: eager.unwrap_or(DEFAULT_EAGER_LIMIT),
            shm_eager_limit: shm_eager_limit(
                env_usize("MUTIRAO_SHM_EAGER_LIMIT")?,
                eager,
                shm_ring,
                oversubscribed && cma,
            ),
            spin: Duration::from_micros(spin_env.unwrap_or(default_spin) as u64),
            spin_shm: Duration::from_micros(spin_env.unwrap_or(default_spin_shm) as u64),
            yield_for: Duration::from_micros(
                env_usize("MUTIRAO_YIELD_US")?.unwrap_or(if oversubscribed { 1000 } else { 0 })
                    as u64,
            ),
            polite_yield: Duration::from_micros(
                env_usize("MUTIRAO_POLITE_YIELD_US")?
                    .map_or(crate::engine::POLITE_YIELD.as_micros() as u64, |v| v as u64),
            ),
            shm,
            cma,
            shm_ring,
            shm_prefault: env_usize("MUTIRAO_SHM_PREFAULT")?.unwrap_or(0) != 0,
            connect_timeout: Duration::from_secs(
                env_usize("MUTIRAO_CONNECT_TIMEOUT_S")?.unwrap_or(60) as u64,
            ),
            outnumbered: oversubscribed,
        })
    }
}

/// The eager limit towards shared-memory peers: `MUTIRAO_SHM_EAGER_LIMIT`, else an explicit
/// `MUTIRAO_EAGER_LIMIT` (so a job that sets one limit gets it everywhere, as before), else the
/// ring size: streaming a message through the ring (one copy on each side, pipelined) beat the
/// single-copy rendezvous at every size up to the ring's on the development machine — when the
/// two copies can run on two cores at once. When ranks outnumber the cores (`single_copy`, with
/// cross-memory copies allowed) no core is spare for the second copy, and the receiver's single
/// copy wins from [`DEFAULT_EAGER_LIMIT`] up: 4 ranks on 2 cores, allreduce of 4 MiB 0.70×,
/// bcast of 1 MiB 0.62× the time of streaming (`MUTIRAO_SHM_EAGER_LIMIT=65536` against the
/// default, interleaved, 5 rounds, 2026-11-27).
fn shm_eager_limit(
    shm: Option<usize>,
    general: Option<usize>,
    ring: usize,
    single_copy: bool,
) -> usize {
    let default = if single_copy {
        DEFAULT_EAGER_LIMIT.min(ring)
    } else {
        ring
    };
    shm.or(general).unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::shm_eager_limit;

    #[test]
    fn shm_eager_limit_defaults_to_the_ring_and_obeys_both_variables() {
        assert_eq!(shm_eager_limit(None, None, 2 << 20, false), 2 << 20);
        assert_eq!(shm_eager_limit(None, Some(4096), 2 << 20, false), 4096);
        assert_eq!(
            shm_eager_limit(Some(65536), Some(4096), 2 << 20, false),
            65536
        );
    }

    #[test]
    fn shm_eager_limit_drops_to_the_general_default_when_ranks_outnumber_cores() {
        assert_eq!(
            shm_eager_limit(None, None, 2 << 20, true),
            super::DEFAULT_EAGER_LIMIT
        );
        // A smaller ring still bounds it; either variable still wins.
        assert_eq!(shm_eager_limit(None, None, 16384, true), 16384);
        assert_eq!(shm_eager_limit(None, Some(4096), 2 << 20, true), 4096);
        assert_eq!(shm_eager_limit(Some(1 << 20), None, 2 << 20, true), 1 << 20);
    }
}
