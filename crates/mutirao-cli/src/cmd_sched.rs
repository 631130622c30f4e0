//! `mutirao simulate`, `mutirao schedule` and `mutirao dag …`: a thin shell over the
//! `mutirao-sched` library (task graphs, the HLogP simulator, the schedulers). This module does
//! the file I/O: it reads inputs, names the file in every error, and writes outputs atomically
//! (temporary file, fsync, rename); on bad input nothing is written.

use crate::fsutil::write_atomic;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use mutirao_model::Model;
use mutirao_sched::gen::{self, RandomParams};
use mutirao_sched::platform::Platform;
use mutirao_sched::sched::{self, Algorithm, SchedOptions, Schedule};
use mutirao_sched::sim::{self, CommMode, SimOptions, WaitMode};
use mutirao_sched::{gantt, Dag};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The scheduling subcommands (flattened into the top level).
#[derive(Subcommand)]
pub enum SchedCommand {
    /// Predict the makespan of a scheduled task graph with the HLogP simulator.
    Simulate(SimulateArgs),
    /// Map a task graph onto a model's hosts (HEFT, HLogP-HEFT, PEFT, round-robin).
    Schedule(ScheduleArgs),
    /// Generate, inspect and convert mutirao-dag/1 task graphs.
    #[command(subcommand)]
    Dag(DagCommand),
}

/// `mutirao simulate`.
#[derive(Args)]
pub struct SimulateArgs {
    /// The model: a mutirao-model/1 file, or `preset:gridrio2004`.
    #[arg(long)]
    model: String,
    /// The task graph (mutirao-dag/1).
    #[arg(long)]
    dag: PathBuf,
    /// The schedule (mutirao-schedule/1).
    #[arg(long)]
    schedule: PathBuf,
    /// Print the full result as JSON (makespan_s, per-host busy/idle, per-task and per-message times).
    #[arg(long)]
    json: bool,
    /// Also write an SVG Gantt chart to this file.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Latency model: no CPU overheads; Os+L+Or of delay between hosts, nothing within one.
    #[arg(long)]
    latency_only: bool,
    /// Busy-poll contention: co-located unfinished tasks share their host's CPU.
    #[arg(long)]
    poll: bool,
    /// The thesis's HLogP without contention: every message crosses the wire as if alone.
    /// By default messages in flight together share the NICs and site links they cross
    /// (max–min fair), with the model's capacities (measured by `mutirao calibrate`).
    #[arg(long)]
    no_contention: bool,
    /// A mεμ resource spec (e.g. the testbed's NAME.meu) giving the capacities the model
    /// lacks: `nic_mbit` of each host, `wan.A.B` between sites.
    #[arg(long, value_name = "FILE")]
    resources: Option<PathBuf>,
}

/// `mutirao schedule`.
#[derive(Args)]
pub struct ScheduleArgs {
    /// The model: a mutirao-model/1 file, or `preset:gridrio2004`.
    #[arg(long)]
    model: String,
    /// The task graph (mutirao-dag/1).
    #[arg(long)]
    dag: PathBuf,
    /// Algorithm: hlogp-heft, heft, peft or round-robin.
    #[arg(long, default_value = "hlogp-heft")]
    algo: String,
    /// Where to write the schedule (mutirao-schedule/1).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Also write a hostfile for `mutirao run` (one `host slots=1` line per rank, rank i = task i).
    #[arg(long)]
    hostfile_out: Option<PathBuf>,
    /// Also write an Open MPI-style rankfile (`rank i=host slot=0`).
    #[arg(long)]
    rankfile_out: Option<PathBuf>,
    /// The thesis's HLogP without contention: every message crosses the wire as if alone.
    /// By default messages in flight together share the NICs and site links they cross
    /// (max–min fair), with the model's capacities (measured by `mutirao calibrate`).
    #[arg(long)]
    no_contention: bool,
    /// A mεμ resource spec (e.g. the testbed's NAME.meu) giving the capacities the model
    /// lacks: `nic_mbit` of each host, `wan.A.B` between sites.
    #[arg(long, value_name = "FILE")]
    resources: Option<PathBuf>,
}

/// `mutirao dag …`.
#[derive(Subcommand)]
pub enum DagCommand {
    /// Generate a task graph.
    Gen(DagGenArgs),
    /// Print a task graph as Graphviz DOT.
    Dot {
        /// The task graph (mutirao-dag/1).
        dag: PathBuf,
        /// Write to this file instead of standard output.
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
    },
    /// Convert a WfCommons workflow instance (WfFormat 1.5/1.6 JSON) into a task graph:
    /// work = runtimeInSeconds, bytes = sizes of the files a parent writes and its child reads.
    ImportWfcommons {
        /// The WfCommons instance (JSON).
        input: PathBuf,
        /// Where to write the task graph (mutirao-dag/1).
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
    },
    /// Validate a task graph and print its size.
    Check {
        /// The task graph (mutirao-dag/1).
        dag: PathBuf,
    },
}

/// `mutirao dag gen`.
#[derive(Args)]
pub struct DagGenArgs {
    #[command(subcommand)]
    kind: GenKind,
    /// Where to write the graph (mutirao-dag/1).
    #[arg(short = 'o', long = "output", global = true)]
    output: Option<PathBuf>,
    /// Work of every task, seconds on a speed-1.0 host (structured graphs).
    #[arg(long, default_value_t = 1.0, global = true)]
    work: f64,
    /// Bytes of every edge (structured graphs).
    #[arg(long, default_value_t = 1024, global = true)]
    bytes: u64,
}

/// Graph families.
#[derive(Subcommand)]
pub enum GenKind {
    /// k×k diamond (mesh).
    Diamond {
        /// Side of the mesh.
        #[arg(long, default_value_t = 5)]
        k: usize,
    },
    /// One root sending to n children.
    Fork {
        /// Number of children.
        #[arg(long, default_value_t = 9)]
        n: usize,
    },
    /// n tasks sending to one sink.
    Join {
        /// Number of senders.
        #[arg(long, default_value_t = 9)]
        n: usize,
    },
    /// The thesis's ring: r0 → … → r{n-1} → r0_end.
    Ring {
        /// Number of ring tasks.
        #[arg(long, default_value_t = 3)]
        n: usize,
    },
    /// Gaussian elimination of an m×m matrix.
    Gauss {
        /// Matrix size.
        #[arg(long, default_value_t = 5)]
        m: usize,
    },
    /// FFT on a power-of-two number of points.
    Fft {
        /// Number of points.
        #[arg(long, default_value_t = 4)]
        points: usize,
    },
    /// Topcuoglu's seeded random layered graph.
    Random {
        /// Number of tasks.
        #[arg(long, default_value_t = 100)]
        n: usize,
        /// Communication-to-computation ratio.
        #[arg(long, default_value_t = 1.0)]
        ccr: f64,
        /// Shape α.
        #[arg(long, default_value_t = 1.0)]
        alpha: f64,
        /// Maximum out-degree.
        #[arg(long, default_value_t = 3)]
        out_degree: usize,
        /// Mean task work (seconds at speed 1.0).
        #[arg(long, default_value_t = 1.0)]
        mean_work: f64,
        /// Reference link bandwidth (bytes/s) turning message times into sizes.
        #[arg(long, default_value_t = 1.0e8)]
        bytes_per_s: f64,
        /// Random seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Also write a random model with this many hosts (needs --model-out).
        #[arg(long, default_value_t = 8)]
        hosts: usize,
        /// Heterogeneity β of the random model: 1/speed uniform in [1−β/2, 1+β/2].
        #[arg(long, default_value_t = 0.5)]
        beta: f64,
        /// Write the random model (mutirao-model/1) here.
        #[arg(long)]
        model_out: Option<PathBuf>,
    },
}

/// Run a scheduling subcommand.
pub fn run(cmd: SchedCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SchedCommand::Simulate(a) => simulate(a),
        SchedCommand::Schedule(a) => schedule(a),
        SchedCommand::Dag(DagCommand::Gen(a)) => dag_gen(a),
        SchedCommand::Dag(DagCommand::Dot { dag, output }) => {
            let d = read_dag(&dag)?;
            match output {
                Some(o) => write_atomic(&o, d.to_dot().as_bytes())?,
                None => emit(&d.to_dot())?,
            }
            Ok(ExitCode::SUCCESS)
        }
        SchedCommand::Dag(DagCommand::ImportWfcommons { input, output }) => {
            let d = mutirao_sched::wfcommons::from_wfcommons(&read(&input, "WfCommons instance")?)
                .with_context(|| format!("in {}", input.display()))?;
            write_atomic(&output, format!("{}\n", d.to_json()).as_bytes())?;
            println!(
                "{}: {} tasks, {} edges",
                output.display(),
                d.len(),
                d.edges().len()
            );
            Ok(ExitCode::SUCCESS)
        }
        SchedCommand::Dag(DagCommand::Check { dag }) => {
            let d = read_dag(&dag)?;
            println!(
                "{}: ok, {} tasks, {} edges, acyclic",
                dag.display(),
                d.len(),
                d.edges().len()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn read(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {what} file {}", path.display()))
}

fn read_dag(path: &Path) -> anyhow::Result<Dag> {
    Dag::from_json(&read(path, "task graph")?).with_context(|| format!("in {}", path.display()))
}

fn load_model(spec: &str, resources: Option<&Path>) -> anyhow::Result<(Model, Platform)> {
    let model = if let Some(name) = spec.strip_prefix("preset:") {
        match name {
            "gridrio2004" => mutirao_model::presets::gridrio2004(),
            other => bail!("unknown model preset {other:?}; the presets are: gridrio2004"),
        }
    } else {
        let path = Path::new(spec);
        Model::from_json(&read(path, "model")?).with_context(|| format!("in {}", path.display()))?
    };
    let mut model = model;
    if let Some(r) = resources {
        crate::capacity_spec::apply_file(&mut model, r)?;
    }
    let platform = Platform::from_model(&model).with_context(|| format!("in model {spec}"))?;
    Ok((model, platform))
}

/// Print to standard output (captured in tests).
#[cfg(test)]
fn emit(text: &str) -> anyhow::Result<()> {
    print!("{text}");
    Ok(())
}

/// Print to standard output; a closed pipe (e.g. `| head`) is not an error.
#[cfg(not(test))]
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("cannot write to standard output")
        }
        _ => Ok(()),
    }
}

#[derive(Serialize)]
struct HostOut<'a> {
    name: &'a str,
    busy_s: f64,
    idle_s: f64,
}

#[derive(Serialize)]
struct TaskOut<'a> {
    id: &'a str,
    host: &'a str,
    start_s: f64,
    finish_s: f64,
}

#[derive(Serialize)]
struct MessageOut<'a> {
    from: &'a str,
    to: &'a str,
    bytes: u64,
    send_start_s: f64,
    send_end_s: f64,
    arrival_s: f64,
    recv_start_s: f64,
    recv_end_s: f64,
}

#[derive(Serialize)]
struct SimOut<'a> {
    format: &'static str,
    mode: &'static str,
    contention: bool,
    wait: &'static str,
    makespan_s: f64,
    hosts: Vec<HostOut<'a>>,
    tasks: Vec<TaskOut<'a>>,
    messages: Vec<MessageOut<'a>>,
}

fn simulate(a: SimulateArgs) -> anyhow::Result<ExitCode> {
    let (_, platform) = load_model(&a.model, a.resources.as_deref())?;
    let dag = read_dag(&a.dag)?;
    let s = Schedule::from_json(&read(&a.schedule, "schedule")?)
        .with_context(|| format!("in {}", a.schedule.display()))?;
    let placement = s
        .placement(&dag, &platform)
        .with_context(|| format!("in {}", a.schedule.display()))?;
    let opts = SimOptions {
        comm: if a.latency_only {
            CommMode::LatencyOnly
        } else {
            CommMode::HLogP
        },
        wait: if a.poll {
            WaitMode::Poll
        } else {
            WaitMode::Block
        },
        record_messages: true,
        contention: !a.no_contention,
    };
    let r = sim::simulate(&dag, &platform, &placement, opts)
        .with_context(|| format!("simulating {}", a.schedule.display()))?;
    if let Some(svg) = &a.svg {
        write_atomic(
            svg,
            gantt::gantt_svg(&dag, &platform, &placement, &r).as_bytes(),
        )?;
    }
    let hosts = platform.hosts();
    let tasks = dag.tasks();
    if a.json {
        let out = SimOut {
            format: "mutirao-simulation/1",
            mode: if a.latency_only {
                "latency-only"
            } else {
                "hlogp"
            },
            contention: !a.no_contention,
            wait: if a.poll { "poll" } else { "block" },
            makespan_s: r.makespan_s,
            hosts: r
                .hosts
                .iter()
                .zip(hosts)
                .map(|(u, h)| HostOut {
                    name: &h.name,
                    busy_s: u.busy_s,
                    idle_s: u.idle_s,
                })
                .collect(),
            tasks: r
                .tasks
                .iter()
                .enumerate()
                .map(|(t, tt)| TaskOut {
                    id: &tasks[t].id,
                    host: &hosts[placement.host[t]].name,
                    start_s: tt.start_s,
                    finish_s: tt.finish_s,
                })
                .collect(),
            messages: r
                .messages
                .iter()
                .map(|m| {
                    let e = dag.edges()[m.edge];
                    MessageOut {
                        from: &tasks[e.from].id,
                        to: &tasks[e.to].id,
                        bytes: e.bytes,
                        send_start_s: m.send_start_s,
                        send_end_s: m.send_end_s,
                        arrival_s: m.arrival_s,
                        recv_start_s: m.recv_start_s,
                        recv_end_s: m.recv_end_s,
                    }
                })
                .collect(),
        };
        emit(&format!("{}\n", serde_json::to_string_pretty(&out)?))?;
    } else {
        let mut text = format!(
            "makespan_s {:.6} ({} model{}, {} wait; schedule by {} predicted {:.6})\n{:<28} {:>14} {:>14}\n",
            r.makespan_s,
            if a.latency_only { "latency" } else { "HLogP" },
            if a.no_contention {
                ", no contention"
            } else {
                " with contention"
            },
            if a.poll { "poll" } else { "block" },
            s.algorithm,
            s.makespan_s,
            "host",
            "busy_s",
            "idle_s"
        );
        for (u, h) in r.hosts.iter().zip(hosts) {
            text.push_str(&format!(
                "{:<28} {:>14.6} {:>14.6}\n",
                h.name, u.busy_s, u.idle_s
            ));
        }
        emit(&text)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn schedule(a: ScheduleArgs) -> anyhow::Result<ExitCode> {
    let algo: Algorithm = a.algo.parse()?;
    let (_, platform) = load_model(&a.model, a.resources.as_deref())?;
    let dag = read_dag(&a.dag)?;
    let contention = !a.no_contention;
    let s = sched::schedule_with(&dag, &platform, algo, SchedOptions { contention })?;
    let placement = s.placement(&dag, &platform)?;
    let run = |comm| {
        sim::simulate(
            &dag,
            &platform,
            &placement,
            SimOptions {
                comm,
                contention,
                ..Default::default()
            },
        )
    };
    let hlogp = run(CommMode::HLogP)?;
    let latency = run(CommMode::LatencyOnly)?;
    // Everything computed: now write.
    write_atomic(&a.output, format!("{}\n", s.to_json()).as_bytes())?;
    if let Some(f) = &a.hostfile_out {
        write_atomic(f, s.hostfile(&dag).as_bytes())?;
    }
    if let Some(f) = &a.rankfile_out {
        write_atomic(f, s.rankfile(&dag).as_bytes())?;
    }
    let m = sched::metrics(&dag, &platform, hlogp.makespan_s);
    println!(
        "{}: {} tasks on {} hosts; {} predicts makespan_s {:.6}",
        a.output.display(),
        dag.len(),
        platform.len(),
        s.algorithm,
        s.makespan_s
    );
    if let Some(p) = s.predicted_s {
        match p.contention {
            Some(c) => println!(
                "this schedule under the HLogP simulator: {c:.6} s with contention, {:.6} s without",
                p.no_contention
            ),
            None => println!(
                "this schedule under the HLogP simulator: {:.6} s without contention (the model has no capacities)",
                p.no_contention
            ),
        }
    }
    println!(
        "under the latency model{}: {:.6} s",
        if contention { " with contention" } else { "" },
        latency.makespan_s
    );
    println!(
        "HLogP-simulated SLR {:.4}, speedup {:.4}, efficiency {:.4}",
        m.slr, m.speedup, m.efficiency
    );
    Ok(ExitCode::SUCCESS)
}

fn dag_gen(a: DagGenArgs) -> anyhow::Result<ExitCode> {
    let Some(output) = a.output else {
        bail!("missing -o FILE: where to write the generated task graph");
    };
    let (w, b) = (a.work, a.bytes);
    let mut model_out = None;
    let dag = match a.kind {
        GenKind::Diamond { k } => gen::diamond(k, w, b)?,
        GenKind::Fork { n } => gen::fork(n, w, b)?,
        GenKind::Join { n } => gen::join(n, w, b)?,
        GenKind::Ring { n } => gen::ring(n, w, b)?,
        GenKind::Gauss { m } => gen::gauss(m, w, b)?,
        GenKind::Fft { points } => gen::fft(points, w, b)?,
        GenKind::Random {
            n,
            ccr,
            alpha,
            out_degree,
            mean_work,
            bytes_per_s,
            seed,
            hosts,
            beta,
            model_out: mo,
        } => {
            if let Some(path) = mo {
                let m = gen::random_model(hosts, beta, bytes_per_s, seed)?;
                model_out = Some((path, m.to_json()));
            }
            gen::random(&RandomParams {
                n,
                ccr,
                alpha,
                out_degree,
                mean_work,
                bytes_per_s,
                seed,
            })?
        }
    };
    write_atomic(&output, format!("{}\n", dag.to_json()).as_bytes())?;
    if let Some((path, json)) = model_out {
        write_atomic(&path, format!("{json}\n").as_bytes())?;
    }
    println!(
        "{}: {} tasks, {} edges",
        output.display(),
        dag.len(),
        dag.edges().len()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let p = std::env::temp_dir().join(format!(
                "mutirao-sched-cli-{tag}-{}-{nanos}",
                std::process::id()
            ));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
        fn path(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn gen_diamond(out: &Path) {
        dag_gen(DagGenArgs {
            kind: GenKind::Diamond { k: 5 },
            output: Some(out.to_path_buf()),
            work: 2.0,
            bytes: 4 << 20,
        })
        .unwrap();
    }

    #[test]
    fn contention_without_capacities_names_the_link_and_a_resource_spec_fills_them() {
        let d = TempDir::new("cap");
        gen_diamond(&d.path("d.json"));
        let args = |no_contention: bool, resources: Option<PathBuf>| ScheduleArgs {
            no_contention,
            resources,
            model: "preset:gridrio2004".into(),
            dag: d.path("d.json"),
            algo: "hlogp-heft".into(),
            output: d.path("s.json"),
            hostfile_out: Some(d.path("hosts")),
            rankfile_out: None,
        };
        // The preset has no capacities: contention (the default) cannot run, nothing is written.
        let e = format!("{:#}", schedule(args(false, None)).unwrap_err());
        assert!(
            e.contains("no capacity for the NIC of host")
                && e.contains("--resources")
                && e.contains("--no-contention"),
            "{e}"
        );
        assert!(!d.path("s.json").exists() && !d.path("hosts").exists());
        // A resource spec with every host's NIC and the site links fills them.
        let mut meu = String::from(
            "g: \"gridrio\" { grid, \"wan.UFF.Sinergia\"=100, \"wan.UFF.PUC\"=30, \"wan.Sinergia.PUC\"=30 };\n",
        );
        for (i, (name, site, _)) in mutirao_model::presets::GRIDRIO2004_HOSTS.iter().enumerate() {
            meu.push_str(&format!(
                "h{i}: \"{name}\" <g> {{ host, site=\"{site}\", nic_mbit=100 }};\n"
            ));
        }
        std::fs::write(d.path("g.meu"), meu).unwrap();
        schedule(args(false, Some(d.path("g.meu")))).unwrap();
        let s = Schedule::from_json(&std::fs::read_to_string(d.path("s.json")).unwrap()).unwrap();
        let p = s.predicted_s.expect("both models reported");
        let with = p.contention.expect("a makespan with contention");
        assert!(with >= p.no_contention * (1.0 - 1e-9), "{p:?}");
    }

    #[test]
    fn generate_schedule_simulate_round_trip() {
        let d = TempDir::new("ok");
        gen_diamond(&d.path("d.json"));
        for algo in ["hlogp-heft", "heft", "peft", "round-robin"] {
            schedule(ScheduleArgs {
                no_contention: true,
                resources: None,
                model: "preset:gridrio2004".into(),
                dag: d.path("d.json"),
                algo: algo.into(),
                output: d.path("s.json"),
                hostfile_out: Some(d.path("hosts")),
                rankfile_out: Some(d.path("ranks")),
            })
            .unwrap();
            let s =
                Schedule::from_json(&std::fs::read_to_string(d.path("s.json")).unwrap()).unwrap();
            assert_eq!(s.algorithm, algo);
            assert_eq!(s.tasks.len(), 25);
            let hosts = std::fs::read_to_string(d.path("hosts")).unwrap();
            assert_eq!(hosts.lines().count(), 25);
            assert!(hosts.lines().all(|l| l.ends_with(".br slots=1")), "{hosts}");
            simulate(SimulateArgs {
                no_contention: true,
                resources: None,
                model: "preset:gridrio2004".into(),
                dag: d.path("d.json"),
                schedule: d.path("s.json"),
                json: true,
                svg: Some(d.path("g.svg")),
                latency_only: false,
                poll: false,
            })
            .unwrap();
            let svg = std::fs::read_to_string(d.path("g.svg")).unwrap();
            assert!(svg.starts_with("<svg") && svg.contains("d4_4"), "{algo}");
        }
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(&d.0)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn bad_inputs_name_the_file_and_write_nothing() {
        let d = TempDir::new("bad");
        std::fs::write(
            d.path("cyc.json"),
            r#"{"format":"mutirao-dag/1","tasks":[{"id":"a","work":1},{"id":"b","work":1}],
               "edges":[{"from":"a","to":"b","bytes":1},{"from":"b","to":"a","bytes":1}]}"#,
        )
        .unwrap();
        let e = schedule(ScheduleArgs {
            no_contention: true,
            resources: None,
            model: "preset:gridrio2004".into(),
            dag: d.path("cyc.json"),
            algo: "heft".into(),
            output: d.path("out.json"),
            hostfile_out: None,
            rankfile_out: None,
        })
        .unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("cyc.json") && msg.contains("cycle"), "{msg}");
        assert!(!d.path("out.json").exists());

        // A model that lacks the class a pair needs.
        std::fs::write(
            d.path("m.json"),
            r#"{"format":"mutirao-model/1","hosts":[{"name":"a","site":"x","speed":1},{"name":"b","site":"y","speed":1}],
               "links":[{"class":"same-host","os":[{"from":0,"base_us":1,"per_byte_us":0}],"or":[{"from":0,"base_us":1,"per_byte_us":0}],"l":[{"from":0,"base_us":1,"per_byte_us":0}]}]}"#,
        )
        .unwrap();
        gen_diamond(&d.path("d.json"));
        let e = schedule(ScheduleArgs {
            no_contention: true,
            resources: None,
            model: d.path("m.json").to_string_lossy().into_owned(),
            dag: d.path("d.json"),
            algo: "hlogp-heft".into(),
            output: d.path("out.json"),
            hostfile_out: None,
            rankfile_out: None,
        })
        .unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("m.json") && msg.contains("inter-site"),
            "{msg}"
        );
        assert!(!d.path("out.json").exists());

        // A schedule naming an unknown host: simulate fails and writes no SVG.
        schedule(ScheduleArgs {
            no_contention: true,
            resources: None,
            model: "preset:gridrio2004".into(),
            dag: d.path("d.json"),
            algo: "heft".into(),
            output: d.path("s.json"),
            hostfile_out: None,
            rankfile_out: None,
        })
        .unwrap();
        let text = std::fs::read_to_string(d.path("s.json")).unwrap();
        std::fs::write(d.path("s2.json"), text.replace(".br\"", ".invalid\"")).unwrap();
        let e = simulate(SimulateArgs {
            no_contention: true,
            resources: None,
            model: "preset:gridrio2004".into(),
            dag: d.path("d.json"),
            schedule: d.path("s2.json"),
            json: false,
            svg: Some(d.path("g.svg")),
            latency_only: false,
            poll: false,
        })
        .unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("s2.json") && msg.contains("not in the model"),
            "{msg}"
        );
        assert!(!d.path("g.svg").exists());

        let e = load_model("preset:nope", None).unwrap_err();
        assert!(e.to_string().contains("gridrio2004"));
        let e = dag_gen(DagGenArgs {
            kind: GenKind::Fft { points: 6 },
            output: Some(d.path("f.json")),
            work: 1.0,
            bytes: 1,
        })
        .unwrap_err();
        assert!(format!("{e:#}").contains("power of two"));
        assert!(!d.path("f.json").exists());
    }
}
