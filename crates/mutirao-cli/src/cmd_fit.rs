//! `mutirao fit` (the analytic modeller) and `mutirao calib …` (calibration files, plans and the
//! thesis's legacy formats). Thin shells over `mutirao_model::{fit, calib, strategy, legacy}`.

use crate::fsutil::write_atomic;
use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use mutirao_model::calib::{Calibration, SendMode, StrategyKind};
use mutirao_model::fit::{fit, FitOptions, SpeedReference};
use mutirao_model::legacy::{
    infer_site, output_from_calibration, parse_host_list, parse_output, write_output, CommaStyle,
};
use mutirao_model::strategy::{plan, PlanHost, PlanOptions};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `mutirao fit`.
#[derive(Args)]
pub struct FitArgs {
    /// The calibration (mutirao-calib/1 JSON).
    calib: PathBuf,
    /// Where to write the model (mutirao-model/1 JSON); written atomically.
    #[arg(short, long)]
    output: PathBuf,
    /// Print the fit report (segments, bandwidths, residuals) to stdout.
    #[arg(long)]
    report: bool,
    /// Also write the full report, with per-size residuals, as JSON to this file.
    #[arg(long, value_name = "FILE")]
    report_json: Option<PathBuf>,
    /// Send mode to fit (default: isend if the calibration has it, else send).
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// Host whose speed is 1.0 (default: the fastest host).
    #[arg(long, value_name = "HOST")]
    speed_reference: Option<String>,
    /// Most segments per fitted function.
    #[arg(long, default_value_t = 6)]
    max_segments: usize,
    /// Emit a pair link when the class function misses a pair by more than this relative error.
    #[arg(long, default_value_t = 0.10, conflicts_with = "no_pair_links")]
    pair_threshold: f64,
    /// Never emit pair links (class links only).
    #[arg(long)]
    no_pair_links: bool,
    /// Write the model even when a fitted function misses a measured median by more than 10%
    /// (and by more than 5 µs and 2% of that size's one-way time); the misses are listed in the
    /// model's `poor_fit`. Without it such a fit names each miss and exits 1, writing nothing.
    #[arg(long)]
    allow_poor_fit: bool,
    /// A mεμ resource spec (e.g. a testbed's NAME.meu) for link capacities the calibration did
    /// not measure (`nic_mbit` per host, `wan.A.B` between sites).
    #[arg(long, value_name = "FILE")]
    resources: Option<PathBuf>,
}

/// A send mode on the command line.
#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// Blocking send.
    Send,
    /// Nonblocking send.
    Isend,
}

impl From<ModeArg> for SendMode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Send => SendMode::Send,
            ModeArg::Isend => SendMode::Isend,
        }
    }
}

/// A strategy on the command line.
#[derive(Clone, Copy, ValueEnum)]
pub enum StrategyArg {
    /// Every ordered pair.
    AllPairs,
    /// Thesis II(b): one pair per site, one representative per site pair.
    SiteSampled,
    /// One representative per cluster of similar hosts in each site (needs speeds).
    TypeSampled,
}

/// How to print a host list.
#[derive(Clone, Copy, ValueEnum)]
pub enum HostsFormat {
    /// A readable table.
    Table,
    /// JSON.
    Json,
    /// A `mutirao run --hostfile` file, the site in a comment.
    Hostfile,
}

/// How to read `23,567` in a legacy output file.
#[derive(Clone, Copy, ValueEnum)]
pub enum CommaArg {
    /// 23,567 = 23567.
    Thousands,
    /// 23,567 = 23.567.
    Decimal,
}

/// `mutirao calib …`.
#[derive(Subcommand)]
pub enum CalibCommand {
    /// Validate a calibration file and summarise it (hosts, sweeps, partial state).
    Check {
        /// The calibration (mutirao-calib/1 JSON).
        file: PathBuf,
    },
    /// Print the pairs a strategy measures and what the others inherit (JSON).
    Plan {
        /// A Fig. 4.1 host list, or a calibration JSON (whose measured speeds type-sampled uses).
        hosts: PathBuf,
        /// Planning strategy.
        #[arg(long, value_enum, default_value = "all-pairs")]
        strategy: StrategyArg,
        /// Map a domain suffix to a site (repeatable), e.g. `--site-map ic.uff.br=UFF`.
        #[arg(long, value_name = "SUFFIX=SITE")]
        site_map: Vec<String>,
        /// Do not measure same-host pairs.
        #[arg(long)]
        no_same_host: bool,
        /// Type-sampled cluster tolerance (relative).
        #[arg(long, default_value_t = 0.10)]
        tolerance: f64,
    },
    /// Keep a model's slopes and move its intercepts to a fresh probe calibration (e.g. a
    /// site-sampled run at 64 B): the thesis's cheap analytic refresh.
    Refresh {
        /// The model to refresh (mutirao-model/1 JSON).
        model: PathBuf,
        /// The probe calibration (mutirao-calib/1 JSON).
        probe: PathBuf,
        /// Where to write the refreshed model; written atomically.
        #[arg(short, long)]
        output: PathBuf,
        /// Send mode of the probe sweeps to use (default: isend if present, else send).
        #[arg(long, value_enum)]
        mode: Option<ModeArg>,
    },
    /// Read a thesis Fig. 4.1 host list (`host [exec_path] [site=NAME]` per line).
    LegacyHosts {
        /// The host list.
        file: PathBuf,
        /// Map a domain suffix to a site (repeatable), e.g. `--site-map ic.uff.br=UFF`.
        #[arg(long, value_name = "SUFFIX=SITE")]
        site_map: Vec<String>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: HostsFormat,
    },
    /// Write a calibration as a thesis Fig. 4.2 output file (one message size).
    LegacyOut {
        /// The calibration (mutirao-calib/1 JSON).
        calib: PathBuf,
        /// Message size in bytes (must have been measured).
        #[arg(long)]
        size: u64,
        /// Send mode (default: isend if present, else send).
        #[arg(long, value_enum)]
        mode: Option<ModeArg>,
        /// Output file (default: stdout); written atomically.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Leave out the trailing `# size …` comment (strict thesis layout).
        #[arg(long)]
        no_comment: bool,
    },
    /// Read a thesis Fig. 4.2 output file and print it as JSON (comma readings go to stderr).
    LegacyRead {
        /// The output file.
        file: PathBuf,
        /// How to read numbers such as `23,567`.
        #[arg(long, value_enum, default_value = "thousands")]
        comma: CommaArg,
    },
}

fn read(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {what} {}", path.display()))
}

fn load_calib(path: &Path) -> anyhow::Result<Calibration> {
    let text = read(path, "calibration file")?;
    Calibration::from_json(&text).with_context(|| format!("in {}", path.display()))
}

fn site_map(items: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|s| match s.split_once('=') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_string(), b.to_string())),
            _ => bail!("--site-map {s:?}: expected SUFFIX=SITE, e.g. ic.uff.br=UFF"),
        })
        .collect()
}

/// `mutirao fit`.
pub fn run_fit(a: FitArgs) -> anyhow::Result<ExitCode> {
    let calib = load_calib(&a.calib)?;
    let opts = FitOptions {
        mode: a.mode.map(Into::into),
        seg: mutirao_model::fit::SegOptions {
            max_segments: a.max_segments,
            ..Default::default()
        },
        speed_reference: match a.speed_reference {
            Some(h) => SpeedReference::Host(h),
            None => SpeedReference::Fastest,
        },
        pair_threshold: if a.no_pair_links {
            None
        } else {
            Some(a.pair_threshold)
        },
    };
    if a.max_segments == 0 {
        bail!("--max-segments must be at least 1");
    }
    let (mut model, report) =
        fit(&calib, &opts).with_context(|| format!("fitting {}", a.calib.display()))?;
    // Hosts keep the address they were calibrated at (without the agent port).
    for h in &mut model.hosts {
        if let Some(ch) = calib.host(&h.name) {
            let addr = match ch.address.rsplit_once(':') {
                Some((a, p)) if p.parse::<u16>().is_ok() && !a.contains(':') => a,
                _ => ch.address.as_str(),
            };
            if !addr.is_empty() && addr != h.name {
                h.addr = Some(addr.to_string());
            }
        }
    }
    // A same-host class for every host: measured on the hosts, else from the launcher's own
    // shared memory (calibrate measures it when it runs one rank per host), else refuse.
    let mut notes = Vec::new();
    if !has_same_host(&model) {
        match &calib.launcher_same_host {
            Some(sw) => {
                let l = launcher_same_host_link(&calib, sw, &opts)
                    .context("fitting the launcher's same-host sweep")?;
                notes.push(format!(
                    "same-host class from the launcher host {} (one rank per calibrated host)",
                    sw.src
                ));
                model.links.push(l);
            }
            None => bail!(
                "{}: the calibration measured no two ranks on one host, so the model would have no \
                 same-host class and `schedule` could not place two tasks on one host; re-run \
                 `mutirao calibrate` (it measures the launcher's shared memory when it runs one \
                 rank per host) or calibrate without --no-same-host",
                a.calib.display()
            ),
        }
    }
    if let Some(c) = mutirao_model::capacity::estimate(&calib) {
        model.capacity = Some(c);
    }
    model.eager_limit_bytes = calib.provenance.eager_limit_bytes;
    if let Some(r) = &a.resources {
        crate::capacity_spec::apply_file(&mut model, r)?;
    }
    let misses = mutirao_model::fit::poor_fits(&calib, &model, &report, 0.10, 5.0);
    if !misses.is_empty() {
        if !a.allow_poor_fit {
            for m in &misses {
                eprintln!("mutirao fit: poor fit: {m}");
            }
            bail!(
                "{}: {} measured medians are missed by more than 10% (listed above); nothing \
                 written. Measure more sizes around the misses (calibrate --sizes), or write the \
                 model anyway with --allow-poor-fit (the misses are recorded in its poor_fit)",
                a.calib.display(),
                misses.len()
            );
        }
        model.poor_fit = misses.clone();
    }
    model
        .validate()
        .context("internal error: the fitted model is invalid")?;
    if let Some(p) = &a.report_json {
        let text = serde_json::to_string_pretty(&report).context("serialising the report")?;
        write_atomic(p, &text)?;
    }
    write_atomic(&a.output, model.to_json())?;
    if a.report {
        print!("{}", report.to_text());
    }
    for n in &notes {
        eprintln!("mutirao fit: {n}");
    }
    for m in &model.poor_fit {
        eprintln!("mutirao fit: warning: poor fit written anyway: {m}");
    }
    if let Some(p) = &report.partial {
        eprintln!("mutirao: warning: the calibration is partial ({p}); the model covers what was measured");
    }
    for a in &model.hosts {
        for b in &model.hosts {
            if let Err(e) = model.link_for(&a.name, &b.name) {
                eprintln!(
                    "mutirao: warning: uncovered pair {} -> {}: {e}",
                    a.name, b.name
                );
            }
        }
    }
    eprintln!(
        "{}: {} hosts, {} links ({} mode)",
        a.output.display(),
        model.hosts.len(),
        model.links.len(),
        report.mode.as_str()
    );
    Ok(ExitCode::SUCCESS)
}

/// Whether every host of `model` has a link to itself (a same-host class, or a pair link).
fn has_same_host(model: &mutirao_model::Model) -> bool {
    model
        .hosts
        .iter()
        .all(|h| model.link_for(&h.name, &h.name).is_ok())
}

/// The class-wide same-host link fitted from the launcher's two-rank sweep.
fn launcher_same_host_link(
    calib: &Calibration,
    sw: &mutirao_model::calib::PairSweep,
    opts: &FitOptions,
) -> anyhow::Result<mutirao_model::Link> {
    let mut mini = Calibration::new(StrategyKind::AllPairs, "launcher", 0);
    let mut host = mutirao_model::calib::CalibHost::new(&sw.src, "launcher", &sw.src);
    // The fit needs a speed for the host; any calibrated host's serves (only links are kept).
    host.speed = calib.hosts.iter().find_map(|h| h.speed.clone());
    mini.add_host(host)?;
    let mut sweep = sw.clone();
    sweep.dst = sweep.src.clone();
    mini.pairs.push(sweep);
    let o = FitOptions {
        speed_reference: SpeedReference::Fastest,
        pair_threshold: None,
        ..opts.clone()
    };
    let (m, _) = fit(&mini, &o)?;
    let mut l = m
        .links
        .into_iter()
        .find(|l| l.class == mutirao_model::LinkClass::SameHost)
        .context("the launcher's sweep gave no same-host link")?;
    l.site = None;
    Ok(l)
}

fn plan_hosts(path: &Path, map: &[(String, String)]) -> anyhow::Result<Vec<PlanHost>> {
    let text = read(path, "host list")?;
    if text.trim_start().starts_with('{') {
        let c = Calibration::from_json(&text).with_context(|| format!("in {}", path.display()))?;
        Ok(c.hosts
            .iter()
            .map(|h| PlanHost {
                h: h.speed.as_ref().and_then(|s| s.h_us()),
                ..PlanHost::new(&h.name, &h.site)
            })
            .collect())
    } else {
        let hosts = parse_host_list(&text).with_context(|| format!("in {}", path.display()))?;
        Ok(hosts
            .iter()
            .map(|h| PlanHost::new(&h.name, &infer_site(h, map)))
            .collect())
    }
}

/// `mutirao calib …`.
pub fn run_calib(cmd: CalibCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        CalibCommand::Check { file } => {
            let c = load_calib(&file)?;
            let samples: usize = c
                .pairs
                .iter()
                .flat_map(|p| p.sizes.iter())
                .map(|s| s.samples.len() + s.plogp.len())
                .sum();
            println!(
                "{}: ok, {} hosts, {} sweeps ({} samples), {} inherited pairs, strategy {}, modes {}",
                file.display(),
                c.hosts.len(),
                c.pairs.len(),
                samples,
                c.provenance.inherited.len(),
                c.provenance.strategy.as_str(),
                c.modes()
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            );
            if let Some(p) = &c.partial {
                println!("PARTIAL: {}", p.reason);
                return Ok(ExitCode::from(1));
            }
            Ok(ExitCode::SUCCESS)
        }
        CalibCommand::Plan {
            hosts,
            strategy,
            site_map: sm,
            no_same_host,
            tolerance,
        } => {
            let map = site_map(&sm)?;
            let hs = plan_hosts(&hosts, &map)?;
            let kind = match strategy {
                StrategyArg::AllPairs => StrategyKind::AllPairs,
                StrategyArg::SiteSampled => StrategyKind::SiteSampled,
                StrategyArg::TypeSampled => StrategyKind::TypeSampled,
            };
            let o = PlanOptions {
                same_host: !no_same_host,
                tolerance,
                ..PlanOptions::default()
            };
            let p = plan(kind, &hs, &o).with_context(|| format!("planning {}", hosts.display()))?;
            println!("{}", serde_json::to_string_pretty(&p)?);
            eprintln!(
                "{} pairs to measure, {} inherited",
                p.measure.len(),
                p.inherit.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        CalibCommand::Refresh {
            model,
            probe,
            output,
            mode,
        } => {
            let m = mutirao_model::Model::from_json(&read(&model, "model file")?)
                .with_context(|| format!("in {}", model.display()))?;
            let p = load_calib(&probe)?;
            let (fresh, shifts) =
                mutirao_model::fit::refresh_intercepts(&m, &p, mode.map(Into::into)).with_context(
                    || format!("refreshing {} with {}", model.display(), probe.display()),
                )?;
            write_atomic(&output, fresh.to_json())?;
            for s in &shifts {
                println!(
                    "links[{}] {}: {:+.3} us ({} probe points)",
                    s.link, s.param, s.delta_us, s.points
                );
            }
            if shifts.is_empty() {
                eprintln!("mutirao: warning: no probe sweep matched the model; written unchanged");
            }
            Ok(ExitCode::SUCCESS)
        }
        CalibCommand::LegacyHosts {
            file,
            site_map: sm,
            format,
        } => {
            let map = site_map(&sm)?;
            let text = read(&file, "host list")?;
            let hosts = parse_host_list(&text).with_context(|| format!("in {}", file.display()))?;
            match format {
                HostsFormat::Table => {
                    for h in &hosts {
                        println!(
                            "{:<32} {:<24} {}",
                            h.name,
                            infer_site(h, &map),
                            h.exec_path.as_deref().unwrap_or("-")
                        );
                    }
                }
                HostsFormat::Json => {
                    let v: Vec<serde_json::Value> = hosts
                        .iter()
                        .map(|h| {
                            serde_json::json!({
                                "name": h.name,
                                "site": infer_site(h, &map),
                                "exec_path": h.exec_path,
                            })
                        })
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&v)?);
                }
                HostsFormat::Hostfile => {
                    for h in &hosts {
                        println!("{} slots=1 # site={}", h.name, infer_site(h, &map));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        CalibCommand::LegacyOut {
            calib,
            size,
            mode,
            output,
            no_comment,
        } => {
            let c = load_calib(&calib)?;
            let modes = c.modes();
            let mode: SendMode = match mode {
                Some(m) => m.into(),
                None if modes.contains(&SendMode::Isend) => SendMode::Isend,
                None => SendMode::Send,
            };
            let out = output_from_calibration(&c, size, mode)
                .with_context(|| format!("in {}", calib.display()))?;
            let comment = format!(
                "size {size} B, mode {}, from {}",
                mode.as_str(),
                calib.display()
            );
            let text = write_output(&out, (!no_comment).then_some(comment.as_str()));
            match output {
                Some(p) => write_atomic(&p, &text)?,
                None => print!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        CalibCommand::LegacyRead { file, comma } => {
            let text = read(&file, "legacy output file")?;
            let style = match comma {
                CommaArg::Thousands => CommaStyle::Thousands,
                CommaArg::Decimal => CommaStyle::Decimal,
            };
            let (out, warnings) =
                parse_output(&text, style).with_context(|| format!("in {}", file.display()))?;
            for w in warnings {
                eprintln!("mutirao: warning: {}: {w}", file.display());
            }
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = std::env::temp_dir().join(format!("mutirao-cmdfit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.json");
        write_atomic(&p, "one").unwrap();
        write_atomic(&p, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(write_atomic(&dir.join("no/such/m.json"), "x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Two hosts, four sizes, one sample each; `bend` adds 20 ms to the round trip from 64 KiB
    /// on (a protocol switch one straight line cannot follow).
    fn tiny_calibration_with(bend: bool) -> Calibration {
        use mutirao_model::calib::{CalibHost, PingPongSample, SpeedMeasurement, SpeedSample};
        let mut c = Calibration::new(StrategyKind::AllPairs, "test", 0);
        for (n, w) in [("x", 100.0), ("y", 400.0)] {
            let mut h = CalibHost::new(n, "s", "127.0.0.1:1");
            h.speed = Some(SpeedMeasurement {
                kernel: "k".into(),
                reps: 1,
                samples: vec![SpeedSample {
                    wall_us: w,
                    cpu_us: 100.0,
                }],
            });
            c.add_host(h).unwrap();
        }
        for (a, b) in [("x", "y"), ("y", "x"), ("x", "x"), ("y", "y")] {
            for m in [64u64, 1024, 65536, 1 << 20] {
                let s = PingPongSample {
                    rtt_us: 40.0
                        + 0.02 * m as f64
                        + if bend && m >= 65536 { 20_000.0 } else { 0.0 },
                    os_src_us: 5.0,
                    or_dst_us: 5.0,
                    os_dst_us: 5.0,
                    or_src_us: 5.0,
                    probe_us: None,
                    wait_src_us: None,
                };
                c.record_pingpong(a, b, SendMode::Isend, m, 0, &[s])
                    .unwrap();
            }
        }
        c.finalize(1);
        c
    }

    fn tiny_calibration() -> Calibration {
        tiny_calibration_with(false)
    }

    #[test]
    fn fit_writes_a_valid_model_and_bad_input_writes_nothing() {
        let dir = std::env::temp_dir().join(format!("mutirao-cmdfit-fit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let calib = dir.join("calib.json");
        let model = dir.join("model.json");
        let report = dir.join("report.json");
        std::fs::write(&calib, tiny_calibration().to_json()).unwrap();
        let args = |c: &Path| FitArgs {
            calib: c.to_path_buf(),
            output: model.clone(),
            report: false,
            report_json: Some(report.clone()),
            mode: None,
            speed_reference: None,
            max_segments: 4,
            pair_threshold: 0.1,
            no_pair_links: false,
            allow_poor_fit: false,
            resources: None,
        };
        run_fit(args(&calib)).unwrap();
        let m = mutirao_model::Model::from_json(&std::fs::read_to_string(&model).unwrap()).unwrap();
        m.check_complete().unwrap();
        assert_eq!(m.host("y").unwrap().speed, 0.25);
        assert!(std::fs::read_to_string(&report)
            .unwrap()
            .contains("\"residuals\""));
        // Malformed input: a clear error naming the file, and the old model is untouched.
        std::fs::remove_file(&model).unwrap();
        let bad = dir.join("bad.json");
        std::fs::write(&bad, "{\"format\": \"mutirao-calib/1\", \"hosts\": 3}").unwrap();
        let e = run_fit(args(&bad)).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("bad.json") && msg.contains("line 1"), "{msg}");
        assert!(!model.exists());
        // Legacy output of the same calibration parses back.
        let out = dir.join("out42.txt");
        run_calib(CalibCommand::LegacyOut {
            calib: calib.clone(),
            size: 65536,
            mode: None,
            output: Some(out.clone()),
            no_comment: false,
        })
        .unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        let (o, _) = parse_output(&text, CommaStyle::Thousands).unwrap();
        assert_eq!(o.hosts.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_poor_fit_fails_and_writes_nothing_unless_allowed() {
        let dir = std::env::temp_dir().join(format!("mutirao-cmdfit-poor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let calib = dir.join("calib.json");
        let model = dir.join("model.json");
        std::fs::write(&calib, tiny_calibration_with(true).to_json()).unwrap();
        // One segment per function cannot follow the bend at 64 KiB.
        let args = |allow: bool| FitArgs {
            calib: calib.clone(),
            output: model.clone(),
            report: false,
            report_json: None,
            mode: None,
            speed_reference: None,
            max_segments: 1,
            pair_threshold: 0.1,
            no_pair_links: true,
            allow_poor_fit: allow,
            resources: None,
        };
        let e = format!("{:#}", run_fit(args(false)).unwrap_err());
        assert!(
            e.contains("missed by more than 10%") && e.contains("--allow-poor-fit"),
            "{e}"
        );
        assert!(!model.exists(), "a poor fit was written");
        run_fit(args(true)).unwrap();
        let m = mutirao_model::Model::from_json(&std::fs::read_to_string(&model).unwrap()).unwrap();
        assert!(!m.poor_fit.is_empty());
        assert!(
            m.poor_fit.iter().any(|l| l.contains("B measured")),
            "{:?}",
            m.poor_fit
        );
        // With the default segments the same calibration fits.
        std::fs::remove_file(&model).unwrap();
        let mut a = args(false);
        a.max_segments = 6;
        run_fit(a).unwrap();
        let m = mutirao_model::Model::from_json(&std::fs::read_to_string(&model).unwrap()).unwrap();
        assert!(m.poor_fit.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn site_map_parses_and_rejects() {
        assert_eq!(
            site_map(&["ic.uff.br=UFF".into()]).unwrap(),
            [("ic.uff.br".to_string(), "UFF".to_string())]
        );
        let e = site_map(&["nope".into()]).unwrap_err();
        assert!(e.to_string().contains("SUFFIX=SITE"), "{e}");
    }
}
