//! Master/worker applications over `mutirao run`, any policy: matrix multiplication (a task is
//! one row of C), a primes count, and Mandelbrot; each checks its result against a serial
//! computation (all of it for primes; up to 64 rows spread over the matrix or image otherwise).
//! The last line is `… elapsed_s=T`, the master's time from the first hand-out to the last result.
//!
//! ```text
//! cargo build --release -p mutirao-mw --example mw
//! mutirao run -n 5 target/release/examples/mw matmul --n 300 --policy hnow --table
//! mutirao run -n 4 target/release/examples/mw primes --n 2000000 --policy join
//! mutirao run -n 4 target/release/examples/mw mandelbrot --n 600 --policy awf --log mw.jsonl
//! ```
//!
//! Options: `--policy static|hnow|hnow-improved|join|gss|awf|steal` (default hnow),
//! `--n N` (problem size), `--tam T` (TAM_BLOCO, default 10), `--config FILE` (the repository's
//! KEY=VALUE file; `--tam` overrides it), `--log FILE` (append the JSON-lines repository log),
//! `--table` (print the per-iteration table and the measurement algorithm's proposals),
//! `--add N --add-at PCT` (WORKERS_ADD, PERC_CONS_ADD: spawn N more workers once PCT % of the
//! tasks are done — HNOW's dynamic inclusion; needs a launcher that spawns, `mutirao run`; the
//! spawn does not pause the master: it goes on handing out work until the workers are there),
//! `--add-hosts H1,H2,…` (where to spawn them: hostfile hosts, cycled), `--choose` (spawn only
//! on the candidates of `--add-hosts` that shorten the predicted makespan — issue 13 item 5:
//! each candidate's rate is its relative speed times the members' measured rate per unit of
//! speed, its spawn cost the one measured last time, `mutirao_mw::choose::choose_k` decides;
//! up to `--add` hosts, possibly none), `--speeds H=S,…` and/or `--model FILE`
//! (`mutirao-model/1`: host speeds by name or address, for every member and candidate host),
//! `--spawn-history FILE` (JSON host → seconds: read for the candidates' spawn costs, updated
//! with every spawn's measured per-host latency; unknown hosts are assumed to cost the median
//! of those known, or 0.5 s), `--spawn-via PROG` (spawn PROG with the same arguments instead
//! of this program, e.g. a wrapper that adds a per-host start-up delay), `--blocking-spawn`
//! (the thesis's way: the master waits for the new workers before it goes on),
//! `--verify full|sample` (compare the whole result with a serial computation on the master —
//! seed 003's check 1, bit for bit — or, the default, up to 64 rows spread over the matrix or
//! image; primes are always checked whole).
//! Every rank builds A and B from the same seed (B is "broadcast" by construction); the rows of
//! C travel back as 64-bit integers, so the result is bit-exact.

use mutirao_mw::choose::{choose, choose_k, Candidate};
use mutirao_mw::{driver, measure, Config, PolicyKind};

/// A worker's host address, to the master (`--choose`).
const TAG_HOST: i32 = 0x4d57_0100;
use std::io::Write;

const USAGE: &str = "usage: mw (matmul|primes|mandelbrot) [--n N] [--policy P] [--tam T] [--config FILE] [--log FILE] [--table] [--add N] [--add-at PCT] [--add-hosts H,..] [--choose] [--speeds H=S,..] [--model FILE] [--spawn-history FILE] [--spawn-via PROG] [--blocking-spawn] [--verify full|sample]
  run it under the launcher: mutirao run -n 4 target/release/examples/mw matmul --n 300";

struct Opts {
    app: String,
    n: u64,
    policy: PolicyKind,
    cfg: Config,
    log: Option<String>,
    table: bool,
    add_hosts: Vec<String>,
    choose: bool,
    speeds: std::collections::BTreeMap<String, f64>,
    history: Option<String>,
    spawn_via: Option<String>,
    blocking_spawn: bool,
    verify_full: bool,
}

fn parse() -> Result<Opts, String> {
    let mut a = std::env::args().skip(1);
    let app = a.next().ok_or(USAGE)?;
    if app == "--help" || app == "-h" {
        return Err(USAGE.into());
    }
    let mut o = Opts {
        n: match app.as_str() {
            "matmul" => 300,
            "primes" => 1_000_000,
            "mandelbrot" => 400,
            _ => return Err(format!("unknown application {app:?}\n{USAGE}")),
        },
        app,
        policy: PolicyKind::Hnow,
        cfg: Config::default(),
        log: None,
        table: false,
        add_hosts: Vec::new(),
        choose: false,
        speeds: Default::default(),
        history: None,
        spawn_via: None,
        blocking_spawn: false,
        verify_full: false,
    };
    let mut tam = None;
    while let Some(k) = a.next() {
        let mut v = || a.next().ok_or(format!("{k} needs a value\n{USAGE}"));
        match k.as_str() {
            "--n" => o.n = v()?.parse().map_err(|_| "--n: not a number".to_string())?,
            "--policy" => o.policy = v()?.parse().map_err(|e: mutirao_mw::Error| e.to_string())?,
            "--tam" => {
                tam = Some(
                    v()?.parse::<u64>()
                        .map_err(|_| "--tam: not a number".to_string())?,
                )
            }
            "--config" => {
                let f = v()?;
                let text = std::fs::read_to_string(&f).map_err(|e| format!("{f}: {e}"))?;
                o.cfg = Config::parse(&text).map_err(|e| format!("{f}: {e}"))?;
            }
            "--log" => o.log = Some(v()?),
            "--add" => {
                o.cfg.workers_add = v()?
                    .parse()
                    .map_err(|_| "--add: not a number".to_string())?
            }
            "--add-at" => {
                o.cfg.perc_cons_add = v()?
                    .parse()
                    .map_err(|_| "--add-at: not a number".to_string())?
            }
            "--table" => o.table = true,
            "--add-hosts" => {
                o.add_hosts = v()?
                    .split(',')
                    .filter(|h| !h.is_empty())
                    .map(str::to_string)
                    .collect()
            }
            "--choose" => o.choose = true,
            "--speeds" => {
                for kv in v()?.split(',').filter(|x| !x.is_empty()) {
                    let (h, sp) = kv
                        .split_once('=')
                        .ok_or(format!("--speeds: {kv:?} is not HOST=SPEED"))?;
                    let sp: f64 = sp
                        .parse()
                        .ok()
                        .filter(|x: &f64| x.is_finite() && *x > 0.0)
                        .ok_or(format!("--speeds: {sp:?} is not a speed above 0"))?;
                    o.speeds.insert(h.to_string(), sp);
                }
            }
            "--model" => {
                let f = v()?;
                let text = std::fs::read_to_string(&f).map_err(|e| format!("{f}: {e}"))?;
                let m = mutirao_model::Model::from_json(&text).map_err(|e| format!("{f}: {e}"))?;
                for h in &m.hosts {
                    o.speeds.entry(h.name.clone()).or_insert(h.speed);
                    if let Some(a) = &h.addr {
                        // "ip:port" or "ip": the address part names the host in hostfiles.
                        let ip = a.rsplit_once(':').map_or(a.as_str(), |(ip, _)| ip);
                        o.speeds.entry(ip.to_string()).or_insert(h.speed);
                    }
                }
            }
            "--spawn-history" => o.history = Some(v()?),
            "--spawn-via" => o.spawn_via = Some(v()?),
            "--blocking-spawn" => o.blocking_spawn = true,
            "--verify" => {
                o.verify_full = match v()?.as_str() {
                    "full" => true,
                    "sample" => false,
                    other => return Err(format!("--verify: {other:?} is not full or sample")),
                }
            }
            "--help" | "-h" => return Err(USAGE.into()),
            other => return Err(format!("unknown option {other:?}\n{USAGE}")),
        }
    }
    if let Some(t) = tam {
        o.cfg.tam_bloco = t;
    }
    o.cfg.validate().map_err(|e| e.to_string())?;
    if o.choose {
        if o.add_hosts.is_empty() {
            return Err("--choose needs the candidates: --add-hosts H1,H2,…".into());
        }
        if o.cfg.workers_add == 0 {
            return Err("--choose needs --add N (at most N hosts are added)".into());
        }
        if let Some(h) = o.add_hosts.iter().find(|h| !o.speeds.contains_key(*h)) {
            return Err(format!(
                "--choose: no speed for candidate {h}: give --speeds {h}=S or a --model naming it"
            ));
        }
    }
    Ok(o)
}

/// Host → last measured spawn latency, s (`--spawn-history`).
type History = std::collections::BTreeMap<String, f64>;

fn read_history(path: &str) -> Result<History, String> {
    match std::fs::read_to_string(path) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| {
            format!("{path}: not a spawn history (a JSON object host → seconds): {e}")
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(History::new()),
        Err(e) => Err(format!("{path}: {e}")),
    }
}

/// Write the history atomically (temporary file, fsync, rename).
fn write_history(path: &str, h: &History) -> Result<(), String> {
    let tmp = format!("{path}.tmp{}", std::process::id());
    let text = serde_json::to_string_pretty(h).map_err(|e| e.to_string())?;
    let mut f = std::fs::File::create(&tmp).map_err(|e| format!("{tmp}: {e}"))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("{tmp}: {e}"))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{path}: {e}"))
}

/// Record a spawn's latency as the cost of its host — only for a spawn on one host: children
/// connect after the group's fence, so in a spawn over several hosts every host's figure is at
/// least the slowest host's start-up. Recorded under the name the launcher reported and, when
/// the spawn named its host, under that name too.
fn remember(h: &mut History, s: &mutirao::Spawned, asked: &[String]) {
    let [(host, d)] = s.latency.as_slice() else {
        return;
    };
    h.insert(host.clone(), d.as_secs_f64());
    if let Some(a) = asked.first().filter(|a| asked.iter().all(|x| x == *a)) {
        h.insert(a.clone(), d.as_secs_f64());
    }
}

/// The spawn cost assumed for a host never spawned on: the median of those known, or 0.5 s.
fn assumed_cost(h: &History) -> f64 {
    let mut v: Vec<f64> = h.values().copied().collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.5
    } else {
        v[v.len() / 2]
    }
}

fn lcg(seed: u64, i: u64) -> i64 {
    let x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(i.wrapping_mul(1442695040888963407));
    ((x >> 33) % 19) as i64 - 9
}

/// A block's computation: (first task, tasks) → result bytes.
type Task = Box<dyn FnMut(u64, u64) -> Vec<u8>>;

/// The number of tasks and the task function.
fn app(o: &Opts) -> (u64, Task) {
    let n = o.n;
    match o.app.as_str() {
        "matmul" => {
            let a: Vec<i64> = (0..n * n).map(|i| lcg(1, i)).collect();
            let b: Vec<i64> = (0..n * n).map(|i| lcg(2, i)).collect();
            (
                n,
                Box::new(move |first, len| {
                    let mut out = Vec::with_capacity((len * n * 8) as usize);
                    for i in first..first + len {
                        for j in 0..n {
                            let mut s = 0i64;
                            for k in 0..n {
                                s += a[(i * n + k) as usize] * b[(k * n + j) as usize];
                            }
                            out.extend_from_slice(&s.to_le_bytes());
                        }
                    }
                    out
                }),
            )
        }
        "primes" => {
            // Tasks are ranges of 1000 numbers below n.
            let tasks = n.div_ceil(1000);
            (
                tasks,
                Box::new(move |first, len| {
                    let lo = first * 1000;
                    let hi = ((first + len) * 1000).min(n);
                    let c = (lo..hi).filter(|&x| is_prime(x)).count() as u64;
                    c.to_le_bytes().to_vec()
                }),
            )
        }
        _ => (
            n,
            Box::new(move |first, len| {
                // Rows of an n × n image of [-2, 1] × [-1.5, 1.5], 500 iterations at most.
                let mut out = Vec::with_capacity((len * n * 2) as usize);
                for y in first..first + len {
                    for x in 0..n {
                        let (cr, ci) = (
                            -2.0 + 3.0 * x as f64 / n as f64,
                            -1.5 + 3.0 * y as f64 / n as f64,
                        );
                        let (mut zr, mut zi, mut k) = (0.0f64, 0.0f64, 0u16);
                        while k < 500 && zr * zr + zi * zi <= 4.0 {
                            (zr, zi) = (zr * zr - zi * zi + cr, 2.0 * zr * zi + ci);
                            k += 1;
                        }
                        out.extend_from_slice(&k.to_le_bytes());
                    }
                }
                out
            }),
        ),
    }
}

fn is_prime(x: u64) -> bool {
    if x < 2 {
        return false;
    }
    let mut d = 2;
    while d * d <= x {
        if x % d == 0 {
            return false;
        }
        d += 1;
    }
    true
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&o) {
        eprintln!("mw: {e}");
        std::process::exit(1);
    }
}

fn run(o: &Opts) -> Result<(), Box<dyn std::error::Error>> {
    let world = mutirao::init()?;
    let (tasks, mut task) = app(o);
    if world.is_spawned() {
        // A worker added while the job runs: the master is rank 0 of `world` (the merged
        // communicator of the spawn).
        driver::worker(&world, &mut *task)?;
        world.finalize()?;
        return Ok(());
    }
    if world.size() < 2 {
        return Err("a master/worker run needs at least 2 ranks: mutirao run -n 4 …".into());
    }
    // Workers the master lost (their death is normal, not an error of the job).
    let mut lost: Vec<usize> = Vec::new();
    if world.rank() == 0 {
        let mut policy = o.policy.build(&o.cfg)?;
        let per_task = match o.app.as_str() {
            "matmul" => o.n * 8,
            "mandelbrot" => o.n * 2,
            _ => 8,
        } as usize;
        let mut result: Vec<u8> = vec![
            0;
            if o.app == "primes" {
                0
            } else {
                tasks as usize * per_task
            }
        ];
        let mut primes = 0u64;
        let mut log: Vec<u8> = Vec::new();
        // Dynamic inclusion (HNOW): WORKERS_ADD more workers of this program once
        // PERC_CONS_ADD % of the tasks are done, spawned without pausing the master; a spawn
        // that fails leaves the job as it is.
        let mut added: Vec<mutirao::Spawned> = Vec::new();
        let mut tried = o.cfg.workers_add == 0;
        // The spawn under way and the hosts it was asked for.
        let mut pending: Option<(mutirao::PendingSpawn, Vec<String>)> = None;
        let mut t_first: Option<std::time::Instant> = None;
        let mut history = match &o.history {
            Some(p) => read_history(p)?,
            None => History::new(),
        };
        // The members' hosts (every original worker told the master its address), for their
        // speeds: the rate per unit of speed is what a candidate's speed multiplies.
        let member_speed: f64 = if o.choose {
            let mut sum = 0.0;
            for r in 1..world.size() {
                let (host, _): (String, _) = world.recv_obj(r, TAG_HOST)?;
                sum += o.speeds.get(&host).copied().ok_or_else(|| {
                    format!("--choose: no speed for worker {r}'s host {host}: give --speeds {host}=S or a --model naming it")
                })?;
            }
            sum
        } else {
            0.0
        };
        let joined_of = |s: &mutirao::Spawned| -> Vec<driver::Joined> {
            let lat = s.elapsed.as_secs_f64();
            (1..s.comm.size())
                .map(|r| driver::Joined {
                    comm: s.comm.clone(),
                    rank: r,
                    host: s
                        .latency
                        .get((r - 1).min(s.latency.len().saturating_sub(1)))
                        .map(|(h, _)| h.clone())
                        .unwrap_or_default(),
                    spawn_latency_s: lat,
                })
                .collect()
        };
        let mut grow = |done: u64, total: u64| -> Vec<driver::Joined> {
            let t0 = *t_first.get_or_insert_with(std::time::Instant::now);
            if let Some((p, asked)) = pending.as_mut() {
                let asked = asked.clone();
                return match p.test() {
                    Ok(None) => Vec::new(),
                    Ok(Some(s)) => {
                        pending = None;
                        eprintln!(
                            "mw: {} worker(s) added at {done}/{total} tasks in {:.1} ms (per host: {})",
                            s.comm.size() - 1,
                            s.elapsed.as_secs_f64() * 1e3,
                            s.latency
                                .iter()
                                .map(|(h, d)| format!("{h} {:.1} ms", d.as_secs_f64() * 1e3))
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                        remember(&mut history, &s, &asked);
                        let j = joined_of(&s);
                        added.push(s);
                        j
                    }
                    Err(e) => {
                        pending = None;
                        eprintln!("mw: no workers added ({e}); going on with those there are");
                        Vec::new()
                    }
                };
            }
            if tried || (done as f64) * 100.0 < o.cfg.perc_cons_add * total as f64 {
                return Vec::new();
            }
            tried = true;
            let hosts: Vec<String> = if o.choose {
                let elapsed = t0.elapsed().as_secs_f64().max(1e-6);
                let members_rate = (done as f64 / elapsed).max(1e-9);
                let per_speed = members_rate / member_speed;
                let default = assumed_cost(&history);
                let cands: Vec<Candidate> = o
                    .add_hosts
                    .iter()
                    .map(|h| Candidate {
                        name: h.clone(),
                        rate: o.speeds[h] * per_speed,
                        spawn_s: history.get(h).copied().unwrap_or(default),
                    })
                    .collect();
                let remaining = (total - done) as f64;
                let picks = choose_k(&cands, members_rate, remaining, o.cfg.workers_add as usize);
                let one = choose(&cands, members_rate, remaining);
                eprintln!(
                    "mw: at {done}/{total} tasks, {members_rate:.2} tasks/s: predicted {:.2} s without adding; {}; adding [{}]",
                    one.without_s,
                    cands
                        .iter()
                        .zip(&one.with_s)
                        .map(|(c, t)| format!(
                            "with {} ({:.2} tasks/s, spawn {:.2} s{}) {t:.2} s",
                            c.name,
                            c.rate,
                            c.spawn_s,
                            if history.contains_key(&c.name) { "" } else { " assumed" }
                        ))
                        .collect::<Vec<_>>()
                        .join("; "),
                    picks.iter().map(|&i| cands[i].name.as_str()).collect::<Vec<_>>().join(", ")
                );
                if picks.is_empty() {
                    return Vec::new();
                }
                picks.iter().map(|&i| cands[i].name.clone()).collect()
            } else {
                o.add_hosts.clone()
            };
            let n = if o.choose {
                hosts.len()
            } else {
                o.cfg.workers_add as usize
            };
            let mut spec = mutirao::SpawnSpec::new(n)
                .args(std::env::args().skip(1))
                .hosts(hosts);
            if let Some(p) = &o.spawn_via {
                spec = spec.program(p);
            }
            let asked = spec.hosts.clone();
            if o.blocking_spawn {
                // The thesis's way (MPI_Comm_spawn): the master waits for the new workers.
                return match world.spawn(&spec) {
                    Ok(s) => {
                        eprintln!(
                            "mw: {} worker(s) added at {done}/{total} tasks in {:.1} ms (blocking; per host: {})",
                            s.comm.size() - 1,
                            s.elapsed.as_secs_f64() * 1e3,
                            s.latency
                                .iter()
                                .map(|(h, d)| format!("{h} {:.1} ms", d.as_secs_f64() * 1e3))
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                        remember(&mut history, &s, &asked);
                        let j = joined_of(&s);
                        added.push(s);
                        j
                    }
                    Err(e) => {
                        eprintln!("mw: no workers added ({e}); going on with those there are");
                        Vec::new()
                    }
                };
            }
            match world.spawn_nonblocking(&spec) {
                Ok(p) => pending = Some((p, asked)),
                Err(e) => eprintln!("mw: no workers added ({e}); going on with those there are"),
            }
            Vec::new()
        };
        let rep = driver::master_growing(
            &world,
            policy.as_mut(),
            tasks,
            &mut |first, len, bytes: &[u8]| {
                if o.app == "primes" {
                    primes += u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]));
                } else {
                    let at = first as usize * per_task;
                    let end = (at + bytes.len()).min(result.len());
                    debug_assert_eq!(bytes.len(), len as usize * per_task);
                    result[at..end].copy_from_slice(&bytes[..end - at]);
                }
            },
            Some(&mut log),
            Some(&mut grow),
        )?;
        // A spawn still under way when the work ended: its workers are dismissed.
        if let Some((p, asked)) = pending.take() {
            match p.wait() {
                Ok(s) => {
                    eprintln!(
                        "mw: {} worker(s) arrived after the work ended; dismissed",
                        s.comm.size() - 1
                    );
                    remember(&mut history, &s, &asked);
                    for r in 1..s.comm.size() {
                        driver::dismiss(&s.comm, r)?;
                    }
                    added.push(s);
                }
                Err(e) => eprintln!("mw: no workers added ({e})"),
            }
        }
        if let Some(p) = &o.history {
            write_history(p, &history)?;
        }
        // The added workers' finalize is a barrier on their spawn communicator.
        for s in &added {
            s.comm.barrier()?;
        }
        // Check against a serial computation on the master: everything for primes (and with
        // `--verify full`), up to 64 rows spread over the image or matrix otherwise (a whole
        // serial product of a large matrix takes longer than the parallel run).
        let t = std::time::Instant::now();
        let ok = if o.app == "primes" {
            let serial = task(0, tasks);
            primes == u64::from_le_bytes(serial[..8].try_into()?)
        } else if o.verify_full {
            result == task(0, tasks)
        } else {
            let step = tasks.div_ceil(64).max(1);
            (0..tasks).step_by(step as usize).all(|r| {
                let row = task(r, 1);
                result[r as usize * per_task..(r as usize + 1) * per_task] == row[..]
            })
        };
        let serial_s = t.elapsed().as_secs_f64();
        println!(
            "{} n={} policy={} ranks={}: {} tasks in {:.3} s (check on the master {:.3} s), per worker {:?}{}; result {} ({})",
            o.app,
            o.n,
            o.policy.name(),
            world.size(),
            rep.tasks,
            rep.elapsed_s,
            serial_s,
            rep.per_worker,
            if rep.lost.is_empty() { String::new() } else { format!(", lost {:?}", rep.lost) },
            if ok { "correct" } else { "WRONG" },
            if o.app == "primes" || o.verify_full {
                "whole result compared with a serial run"
            } else {
                "sampled rows compared with a serial run"
            }
        );
        // Seed 003 check 2: every task completed exactly once, audited from the repository log.
        let records = mutirao_mw::log::parse(std::str::from_utf8(&log)?)?;
        let audited = match mutirao_mw::log::audit(&records, tasks) {
            Ok(blocks) => {
                println!(
                    "exactly-once audit of the repository log: {tasks} tasks in {blocks} counted blocks ({} discarded replicas), none twice, none missing",
                    rep.duplicates
                );
                true
            }
            Err(e) => {
                println!("exactly-once audit of the repository log FAILED: {e}");
                false
            }
        };
        let ok = ok && audited;
        println!("elapsed_s={:.6}", rep.elapsed_s);
        lost = rep.lost.iter().map(|&w| w as usize).collect();
        if let Some(f) = &o.log {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(f)?;
            file.write_all(&log)?;
            file.sync_all()?;
        }
        if o.table {
            match measure::analyse(&records, o.cfg.tam_bloco) {
                Ok(a) => {
                    println!(
                        "| iteration | workers | tasks | worst t_comp s | max/min | comm share |"
                    );
                    println!("|---|---|---|---|---|---|");
                    for i in &a.iterations {
                        println!(
                            "| {} | {} | {} | {:.4} | {:.2} | {:.1} % |",
                            i.iteration,
                            i.workers,
                            i.tasks,
                            i.worst_s,
                            i.imbalance,
                            i.comm_share * 100.0
                        );
                    }
                    println!(
                        "AM proposes TAM_BLOCO={} THRESHOLD_MIN={:.0} THRESHOLD_MAX={:.0} (characterization took {:.1} % of the run)",
                        a.propose_tam_bloco,
                        a.propose_threshold_min,
                        a.propose_threshold_max,
                        a.characterization_share * 100.0
                    );
                }
                Err(e) => println!("(no per-iteration table: {e})"),
            }
        }
        if !ok {
            let _ = finalize(world, &lost);
            std::process::exit(3);
        }
    } else {
        if o.choose {
            let host = std::env::var("MUTIRAO_BIND").unwrap_or_default();
            world.send_obj(&host, 0, TAG_HOST)?;
        }
        driver::worker(&world, &mut *task)?;
    }
    finalize(world, &lost)
}

/// Finalize, where a worker the master already lost may be reported dead again: that is the
/// scenario `mutirao run --continue-on-failure` is for, not an error.
fn finalize(world: mutirao::Comm, lost: &[usize]) -> Result<(), Box<dyn std::error::Error>> {
    match world.finalize() {
        Err(mutirao::Error::PeerFailed { rank, .. }) if lost.contains(&rank) => Ok(()),
        r => Ok(r?),
    }
}
