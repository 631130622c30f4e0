//! `mutirao predict machine`: CRES through the launcher — one rank per host measures op × type
//! costs, its share of a core and W, and send costs to and from the coordinator (rank 0); the
//! launcher assembles the Appendix-B machine model (`mutirao_predict::cres::build_model`) and
//! writes it atomically.

use crate::cmd_run::{self, RunArgs};
use anyhow::{bail, Context};
use mutirao_predict::cres::{self, HostMeasure};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `mutirao predict machine`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Each host (rank i = machine index i; rank 0, the first host, is the coordinator) measures:
  * every op × type (sum_int, mpy_double, shift_long, …) on its CPU clock, Huerta intervals,
    scaled by its share of a core (wall ÷ CPU time of a fixed kernel, ≥ 15 quota periods);
  * W (Eq. 3.5): the kernel's speed relative to the fastest worker (fastest = 1);
  * send costs to and from the coordinator: half ping-pong round trips at --sizes, in ms;
  * a reference kernel (a generic scalar loop, its op counts from its own source) on its CPU
    clock: measured ÷ op-model time is printed as `ref ratio`; with --calibrate-ops every op
    cost of the host is multiplied by it (compiled code keeps values in registers and
    overlaps operations, which ops timed one at a time do not show).
All hosts measure at once (as an application's workers run at once); ping-pongs go one host
at a time. The model's text form (Appendix B + `W[i]=`, `name[i]=`) is read by `mutirao
predict --machines`; a name ending in .json gets the native JSON form.

Examples:
  mutirao predict machine -n 3 -o local.txt                 # 3 ranks on this machine
  mutirao predict machine --testbed g1 -o g1.txt            # one rank per testbed host
  mutirao predict machine --hostfile hosts --token-file t -o lab.txt
  mutirao predict machine --testbed g1 -o raw.txt --save-raw g1.json   # keep the samples
  mutirao predict machine --from-raw g1.json --calibrate-ops -o cal.txt  # no new measurement
  mutirao predict --app pi.pamela --machines g1.txt -p 4")]
pub struct MachineArgs {
    /// Write the machine model here (atomically; `.json` for the native form).
    #[arg(
        short = 'o',
        long,
        value_name = "FILE",
        required_unless_present = "worker"
    )]
    output: Option<PathBuf>,
    /// Number of ranks on this machine (without --hostfile/--testbed).
    #[arg(short = 'n', long = "np", value_name = "N", conflicts_with_all = ["hostfile", "testbed"])]
    n: Option<usize>,
    /// One rank per line of this hostfile, in its order (the first is the coordinator).
    #[arg(long, value_name = "FILE", conflicts_with = "testbed")]
    hostfile: Option<PathBuf>,
    /// The agents' token file (with --hostfile).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// One rank per host of a running testbed (its hostfile order; names from NAME.sites).
    #[arg(long, value_name = "NAME")]
    testbed: Option<String>,
    /// Loop iterations per op sample.
    #[arg(long, default_value_t = 300_000, value_name = "N")]
    iterations: u64,
    /// Samples per op, per W benchmark and per send size.
    #[arg(long, default_value_t = 15, value_name = "K")]
    samples: usize,
    /// Huerta's C: percentage of samples an interval keeps (narrowest window).
    #[arg(long, default_value_t = 80.0, value_name = "C")]
    keep: f64,
    /// Minimum wall seconds of one W-benchmark run (≥ 15 periods of a CPU quota).
    #[arg(long, default_value_t = 0.25, value_name = "S")]
    kernel_s: f64,
    /// Message sizes (bytes) of the send-cost ping-pong.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "16,1024,16384",
        value_name = "B,…"
    )]
    sizes: Vec<usize>,
    /// Scale each host's op costs so that the op model reproduces its reference kernel's time.
    #[arg(long)]
    calibrate_ops: bool,
    /// Also write every host's raw samples (JSON) here, for --from-raw.
    #[arg(long, value_name = "FILE")]
    save_raw: Option<PathBuf>,
    /// Build the model from samples saved by --save-raw instead of measuring.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["n", "hostfile", "testbed", "save_raw"])]
    from_raw: Option<PathBuf>,
    /// End the measurement if it takes longer than S seconds.
    #[arg(long, default_value_t = 600.0, value_name = "S")]
    timeout: f64,
    #[arg(long, hide = true)]
    worker: bool,
    #[arg(long, hide = true)]
    out: Option<PathBuf>,
    #[arg(long, hide = true, value_delimiter = ',')]
    names: Vec<String>,
}

/// The calling thread's CPU time in seconds.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Refuse an output we could not write, before measuring for minutes.
fn check_writable(path: &Path) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        bail!(
            "cannot write {}: directory {} does not exist; create it or choose another -o",
            path.display(),
            dir.display()
        );
    }
    if path.is_dir() {
        bail!("cannot write {}: it is a directory", path.display());
    }
    let probe = dir.join(format!(".mutirao-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").with_context(|| {
        format!(
            "cannot write {}: directory {} is not writable; choose another -o",
            path.display(),
            dir.display()
        )
    })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// `ADDR SITE NAME` lines of a testbed's sites file → the name of `addr`.
fn site_names(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3).then(|| (f[0].to_string(), f[2].to_string()))
        })
        .collect()
}

/// Run `mutirao predict machine`.
pub fn run(a: MachineArgs) -> anyhow::Result<ExitCode> {
    if a.worker {
        return worker(&a);
    }
    let output = a
        .output
        .clone()
        .context("give -o FILE: where to write the machine model")?;
    if a.iterations == 0 || a.samples == 0 {
        bail!("--iterations and --samples must be at least 1");
    }
    if !(a.keep > 0.0 && a.keep <= 100.0) {
        bail!("--keep {}: a percentage in (0, 100]", a.keep);
    }
    if !(a.kernel_s.is_finite() && a.kernel_s > 0.0) {
        bail!("--kernel-s {}: must be > 0", a.kernel_s);
    }
    if a.sizes.is_empty() || a.sizes.contains(&0) {
        bail!("--sizes: give one or more message sizes of at least 1 byte");
    }
    check_writable(&output)?;
    if let Some(p) = &a.save_raw {
        check_writable(p)?;
    }
    let calibration = if a.calibrate_ops {
        cres::Calibration::ReferenceKernel
    } else {
        cres::Calibration::None
    };
    let started = Instant::now();
    if let Some(raw) = &a.from_raw {
        let text = std::fs::read_to_string(raw)
            .with_context(|| format!("cannot read raw samples {}", raw.display()))?;
        let hosts: Vec<HostMeasure> = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a --save-raw file", raw.display()))?;
        return write_model(&a, &output, &hosts, calibration, started);
    }
    let (hostfile, token, names) = match (&a.testbed, &a.hostfile) {
        (Some(name), _) => {
            let f = crate::cmd_testbed::testbed_files(name)?;
            let sites = f.hosts.with_extension("sites");
            let map = std::fs::read_to_string(&sites)
                .map(|t| site_names(&t))
                .unwrap_or_default();
            (Some(f.hosts), a.token_file.clone().or(Some(f.token)), map)
        }
        (None, Some(h)) => (Some(h.clone()), a.token_file.clone(), Vec::new()),
        (None, None) => (None, a.token_file.clone(), Vec::new()),
    };
    let tmp = std::env::temp_dir();
    let pid = std::process::id();
    let (n, ranks_file, names) = match &hostfile {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read hostfile {}", path.display()))?;
            let entries = crate::hostfile::parse(&text)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("in {}", path.display()))?;
            if entries.is_empty() {
                bail!("hostfile {} lists no host", path.display());
            }
            let body: String = entries
                .iter()
                .map(|e| format!("{} slots=1 port={}\n", e.host, e.port))
                .collect();
            let p = tmp.join(format!("mutirao-cres-{pid}.hosts"));
            crate::fsutil::write_atomic(&p, body.as_bytes())?;
            let list: Vec<String> = entries
                .iter()
                .map(|e| {
                    names
                        .iter()
                        .find(|(addr, _)| *addr == e.host)
                        .map_or(e.host.clone(), |(_, n)| n.clone())
                })
                .collect();
            (entries.len(), Some(p), list)
        }
        None => {
            let n = a.n.unwrap_or(2);
            if n == 0 {
                bail!("-n 0: give at least 1 rank (the coordinator)");
            }
            let host = std::fs::read_to_string("/etc/hostname")
                .map(|s| s.trim().to_string())
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "local".into());
            (n, None, (0..n).map(|i| format!("{host}-{i}")).collect())
        }
    };
    let out = tmp.join(format!("mutirao-cres-{pid}.json"));
    let exe = std::env::current_exe().context("cannot find the mutirao binary")?;
    let sizes: Vec<String> = a.sizes.iter().map(usize::to_string).collect();
    let command = vec![
        exe.display().to_string(),
        "predict".into(),
        "machine".into(),
        "--worker".into(),
        "--out".into(),
        out.display().to_string(),
        "--names".into(),
        names.join(","),
        "--iterations".into(),
        a.iterations.to_string(),
        "--samples".into(),
        a.samples.to_string(),
        "--kernel-s".into(),
        a.kernel_s.to_string(),
        "--sizes".into(),
        sizes.join(","),
    ];
    let code = cmd_run::run(RunArgs::job(
        n,
        ranks_file.clone(),
        a.timeout,
        token,
        command,
    ));
    if let Some(p) = &ranks_file {
        let _ = std::fs::remove_file(p);
    }
    let code = code?;
    let result = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    let text = match (code == ExitCode::SUCCESS, result) {
        (true, Ok(t)) => t,
        _ => bail!(
            "the measurement did not complete (see the ranks' messages above); nothing written"
        ),
    };
    let hosts: Vec<HostMeasure> =
        serde_json::from_str(&text).context("the ranks' measurements are malformed")?;
    if let Some(p) = &a.save_raw {
        crate::fsutil::write_atomic(p, text.as_bytes())?;
    }
    write_model(&a, &output, &hosts, calibration, started)
}

fn write_model(
    a: &MachineArgs,
    output: &Path,
    hosts: &[HostMeasure],
    calibration: cres::Calibration,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let (mm, summary) = cres::build_model(hosts, a.keep, calibration)?;
    let body = if output.extension().is_some_and(|e| e == "json") {
        mm.to_json()
    } else {
        mm.to_appendix_b().to_string()
    };
    crate::fsutil::write_atomic(output, body.as_bytes())?;
    let size0 = hosts
        .iter()
        .find_map(|h| h.pingpong.first().map(|p| p.0))
        .unwrap_or(f64::NAN);
    eprintln!(
        "{:<5} {:<16} {:>8} {:>17} {:>14} {:>9}  send({size0}) ms",
        "index", "name", "W", "wall/cpu", "kernel it/s", "ref ratio"
    );
    for s in &summary {
        let send = mm
            .sends
            .iter()
            .find(|p| p.from == s.index && p.to == 0 && p.size == size0)
            .map_or("-".to_string(), |p| {
                format!("[{:.3};{:.3}]", p.cost.lo, p.cost.hi)
            });
        eprintln!(
            "{:<5} {:<16} {:>8} {:>17} {:>14.4e} {:>9}  {send}",
            s.index,
            s.name.as_deref().unwrap_or("-"),
            s.w.map_or("-".into(), |w| format!("{w:.4}")),
            format!("[{:.3};{:.3}]", s.availability.lo, s.availability.hi),
            s.kernel_rate,
            s.reference_ratio.map_or("-".into(), |r| format!("{r:.3}"))
        );
    }
    eprintln!(
        "wrote {} ({} machines, {} costs each, in {:.1} s)",
        output.display(),
        mm.machines.len(),
        mm.machines.first().map_or(0, |m| m.costs.len()),
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

fn worker(a: &MachineArgs) -> anyhow::Result<ExitCode> {
    let world = mutirao::init()?;
    let (me, size) = (world.rank(), world.size());
    let wall0 = Instant::now();
    let wall = move || wall0.elapsed().as_secs_f64();
    let cpu = thread_cpu_s;
    world.barrier()?;
    let ops = cres::measure_ops(a.iterations, a.samples, &cpu);
    let reference = cres::measure_reference(a.samples, &cpu);
    world.barrier()?;
    let kernel = cres::measure_kernel(a.samples.clamp(3, 7), a.kernel_s, &wall, &cpu);
    world.barrier()?;
    // Ping-pong, one worker at a time with the coordinator: half the round trip is one send.
    let mut pingpongs: Vec<Vec<(f64, Vec<f64>)>> = vec![Vec::new(); size];
    for (peer, slot) in pingpongs.iter_mut().enumerate().skip(1) {
        if me == 0 || me == peer {
            for &sz in &a.sizes {
                let mut buf = vec![0u8; sz];
                let mut samples = Vec::with_capacity(a.samples);
                for r in 0..a.samples + 3 {
                    let t = wall();
                    if me == 0 {
                        world.send(&buf, peer, 7)?;
                        world.recv(&mut buf, peer, 7)?;
                    } else {
                        world.recv(&mut buf, 0, 7)?;
                        world.send(&buf, 0, 7)?;
                    }
                    // The first three round trips warm up the connection.
                    if r >= 3 {
                        samples.push((wall() - t) / 2.0);
                    }
                }
                if me == 0 {
                    slot.push((sz as f64, samples));
                }
            }
        }
        world.barrier()?;
    }
    let mine = HostMeasure {
        index: me,
        name: a.names.get(me).cloned().filter(|s| !s.is_empty()),
        ops,
        kernel,
        pingpong: Vec::new(),
        reference,
    };
    if me != 0 {
        let bytes = serde_json::to_vec(&mine)?;
        world.send(&[bytes.len() as u64], 0, 8)?;
        world.send(&bytes, 0, 9)?;
        world.finalize()?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut all = vec![mine];
    for (peer, pp) in pingpongs.iter_mut().enumerate().skip(1) {
        let mut len = [0u64];
        world.recv(&mut len, peer, 8)?;
        let mut bytes = vec![0u8; usize::try_from(len[0]).context("report too large")?];
        world.recv(&mut bytes, peer, 9)?;
        let mut h: HostMeasure = serde_json::from_slice(&bytes)
            .with_context(|| format!("rank {peer}'s measurements are malformed"))?;
        h.pingpong = std::mem::take(pp);
        all.push(h);
    }
    let out = a.out.as_ref().context("--worker needs --out")?;
    crate::fsutil::write_atomic(out, serde_json::to_string(&all)?.as_bytes())?;
    world.finalize()?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn testbed_sites_name_addresses() {
        let m = site_names("10.213.0.1 north n1\n10.213.1.1 south s1\nbad line\n");
        assert_eq!(
            m,
            vec![
                ("10.213.0.1".to_string(), "n1".to_string()),
                ("10.213.1.1".to_string(), "s1".to_string())
            ]
        );
    }

    #[test]
    fn an_unwritable_output_is_refused_before_measuring() {
        let e = check_writable(Path::new("/nonexistent-dir-xyz/m.txt")).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let e = check_writable(Path::new("/tmp")).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
    }
}
