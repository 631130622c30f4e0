//! `mutirao predict`: PeMPSys interval prediction — a thin shell over `mutirao-predict`.
//!
//! * `mutirao predict --app MODEL --machines MACHINES [-p P | --hosts 1,2 | --like M:P] …`
//! * `mutirao predict analyse FILE.rs --fn NAME [--arg n=100] …`
//! * `mutirao predict shares --weights 1,0.4,0.2 --tasks 128 [--fraction F]`
//! * `mutirao predict flow FILE.pas [--card c2=4 …]`
//! * `mutirao predict generate FILE.pas --source TASKS.rs --task T2=work … [-o MODEL]`
//! * `mutirao predict machine [-n N | --hostfile F | --testbed NAME] -o MACHINES` (CRES,
//!   in `cmd_predict_machine`)

use crate::fsutil::write_atomic;
use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use mutirao_predict::analytic::{self, Policy, Prediction, Selection};
use mutirao_predict::machine::{AppendixB, MachineModel};
use mutirao_predict::{amgen, analyse, pamela, pasl, shares};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const PREDICT_HELP: &str = "\
Predicts, without running it, the time of a JoiN-style application on a set of unequal
machines, as an interval [t_min; t_max] (PeMPSys, Herai 2005), and says which term
dominates: T_0 (no contention), the coordinator's CPU, the workers' CPUs, or the network.

MODEL is an Extended-PAMELA model (thesis Appendix A.3 syntax). MACHINES is a machine model,
either the Appendix-B text format (`inter_sum_int[1]=[1.0E-9;2.0E-9]`, `W[1]=1.0`,
`inter_send[1][0](64)=[8.0;17.0]`) or the native JSON form (`.json`).

Examples:
  mutirao predict --app pi.pamela --machines lab.txt -p 8
  mutirao predict --app pi.pamela --machines lab.txt --like 1:32 --policy mean --json
  mutirao predict --app primes.pamela --machines lab.txt -p 4 --policy probability --q 0.08
  mutirao predict analyse task.rs --fn task --arg n=1000000 --task-def ProcessData
  mutirao predict shares --weights 1.0,0.4,0.2 --tasks 128
  mutirao predict flow app.pas --card c2=4 --card c3=4
  mutirao predict generate app.pas --source tasks.rs --task T1=split --task T2=work \
      --task T3=gather -o app.pamela
  mutirao predict machine --testbed g1 -o g1.txt     # measure the machine model (CRES)";

/// Arguments of `mutirao predict`.
#[derive(Args)]
#[command(after_help = PREDICT_HELP, args_conflicts_with_subcommands = true)]
pub struct PredictArgs {
    #[command(subcommand)]
    sub: Option<PredictCommand>,
    /// The application model (Extended-PAMELA text).
    #[arg(long, value_name = "MODEL")]
    app: Option<PathBuf>,
    /// The machine model (Appendix-B text, or JSON if it ends in .json).
    #[arg(long, value_name = "MACHINES")]
    machines: Option<PathBuf>,
    /// Use the P fastest workers by W (default: all workers).
    #[arg(short = 'p', long = "procs", value_name = "P", conflicts_with_all = ["hosts", "like"])]
    procs: Option<usize>,
    /// Use exactly these worker indices, in this order (repeats are fictitious copies).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "I,J,…",
        conflicts_with = "like"
    )]
    hosts: Option<Vec<usize>>,
    /// A homogeneous set: P copies of worker M, written M:P ("32 machines like the fastest").
    #[arg(long, value_name = "M:P")]
    like: Option<String>,
    /// How conditionals are costed.
    #[arg(long, value_enum, default_value_t = PolicyArg::Worst)]
    policy: PolicyArg,
    /// Branch probability Q for conditionals without an `if(Q)` annotation (probability policy).
    #[arg(long, value_name = "Q")]
    q: Option<f64>,
    /// Print the prediction as JSON.
    #[arg(long)]
    json: bool,
}

/// Conditional policy.
#[derive(Clone, Copy, ValueEnum)]
enum PolicyArg {
    /// max over branches (the thesis's implemented worst case)
    Worst,
    /// arithmetic mean of the branches
    Mean,
    /// min over branches
    Best,
    /// Q·then + (1−Q)·else, with `if(Q)` annotations or --q
    Probability,
}

fn policy(p: PolicyArg, q: Option<f64>) -> anyhow::Result<Policy> {
    if let Some(q) = q {
        if !(0.0..=1.0).contains(&q) {
            bail!("--q {q}: a branch probability must be in [0, 1]");
        }
        if !matches!(p, PolicyArg::Probability) {
            bail!("--q is only used with --policy probability");
        }
    }
    Ok(match p {
        PolicyArg::Worst => Policy::Worst,
        PolicyArg::Mean => Policy::Mean,
        PolicyArg::Best => Policy::Best,
        PolicyArg::Probability => Policy::Probability { default_q: q },
    })
}

#[derive(Subcommand)]
enum PredictCommand {
    /// Measure the machine model (CRES): op × type costs, W and send costs on every host,
    /// one rank per host through the launcher; writes the Appendix-B text (or JSON).
    Machine(crate::cmd_predict_machine::MachineArgs),
    /// Score measured run times against a predicted interval: the thesis's interval error
    /// per run (Eq. 5.2), its mean |E| (Eq. 5.3) and the runs inside the interval.
    #[command(after_help = "\
Example:
  mutirao predict error --interval 714,807 726 706 774 758
  -> E = 0 -1.052 0 0 %   mean |E| = 0.263 %   inside 3/4   centre 760.5, mean run 741.0000 (-2.56 %)

E is 0 inside [t_min; t_max], else the distance to the nearest bound over the interval's
centre (positive: slower than predicted).")]
    Error {
        /// The predicted interval, T_MIN,T_MAX (seconds).
        #[arg(long, value_name = "T_MIN,T_MAX")]
        interval: String,
        /// Measured run times (seconds).
        #[arg(required = true, value_name = "T")]
        runs: Vec<f64>,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Count the operations of a Rust task function (op × type), through constant-bound loops,
    /// branches and inlined calls.
    #[command(after_help = "\
Example:
  mutirao predict analyse task.rs --fn task --arg n=1000000 --task-def ProcessData

The supported Rust subset and the charges are documented in docs/prediction.md; anything
outside it is an error naming its line and column.")]
    Analyse {
        /// The Rust source file.
        file: PathBuf,
        /// The task function to start from.
        #[arg(long = "fn", value_name = "NAME")]
        function: String,
        /// A constant value for a parameter of the function, NAME=VALUE (repeatable).
        #[arg(long = "arg", value_name = "NAME=VALUE")]
        args: Vec<String>,
        /// Conditional policy for the counts.
        #[arg(long, value_enum, default_value_t = PolicyArg::Worst)]
        policy: PolicyArg,
        /// Branch probability Q (probability policy).
        #[arg(long, value_name = "Q")]
        q: Option<f64>,
        /// Print a complete task definition `NAME(p,0)={ taskrun{…} }` for a model file instead.
        #[arg(long, value_name = "NAME", conflicts_with = "json")]
        task_def: Option<String>,
        /// Print counts and the model body as JSON.
        #[arg(long)]
        json: bool,
    },
    /// JoiN's static shares S_i = ⌈f·c·W_i/ΣW⌉, rounded so that they sum to ⌈f·c⌉.
    #[command(after_help = "\
Example (thesis Eq. 3.6):
  mutirao predict shares --weights 1.0,0.4,0.2 --tasks 128
  -> 80 32 16")]
    Shares {
        /// Performance factors W_i, comma-separated.
        #[arg(long, value_delimiter = ',', required = true, value_name = "W1,W2,…")]
        weights: Vec<f64>,
        /// Number of tasks c of the batch.
        #[arg(long, value_name = "C")]
        tasks: u64,
        /// Fraction f allocated statically.
        #[arg(long, default_value_t = 1.0, value_name = "F")]
        fraction: f64,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Parse a PASL flow specification and print its batch DAG and series-parallel model L.
    #[command(after_help = "\
Example:
  mutirao predict flow app.pas --card c2=4 --card c3=4")]
    Flow {
        /// The PASL file.
        file: PathBuf,
        /// A value for a named cardinality, NAME=C (repeatable).
        #[arg(long = "card", value_name = "NAME=C")]
        cards: Vec<String>,
    },
    /// Generate the application model (Extended PAMELA) of a PASL flow whose task functions
    /// are in a Rust file (AMGen: analyse each task, compose the batches).
    #[command(after_help = "\
Example:
  mutirao predict generate pi.pas --source pi.rs --task T1=distribute \\
      --task T2=work:in=64:out=64:code=879 --task T3=gather -o pi.pamela
  mutirao predict --app pi.pamela --machines lab.txt -p 8

Each --task names a flow task (T1, T2, …) and the Rust function of its batch, optionally
followed by its sizes in bytes (in = one task's input, out = its output, code = the code
shipped to each worker); missing sizes take --data-in/--data-out/--code-size.")]
    Generate {
        /// The PASL flow specification.
        file: PathBuf,
        /// The Rust file with the task functions.
        #[arg(long, value_name = "FILE.rs")]
        source: PathBuf,
        /// TASK=FUNCTION[:in=B][:out=B][:code=B] (one per flow task).
        #[arg(long = "task", value_name = "SPEC", required = true)]
        tasks: Vec<String>,
        /// A value for a named cardinality, NAME=C (repeatable).
        #[arg(long = "card", value_name = "NAME=C")]
        cards: Vec<String>,
        /// Default input size of a task (bytes).
        #[arg(long, default_value_t = 64.0, value_name = "B")]
        data_in: f64,
        /// Default output size of a task (bytes).
        #[arg(long, default_value_t = 64.0, value_name = "B")]
        data_out: f64,
        /// Default code size shipped per worker (bytes).
        #[arg(long, default_value_t = 1024.0, value_name = "B")]
        code_size: f64,
        /// Write the model here (atomically) instead of to standard output.
        #[arg(short = 'o', long, value_name = "MODEL")]
        output: Option<PathBuf>,
    },
}

/// `TASK=FUNCTION[:in=B][:out=B][:code=B]`.
fn task_spec(
    s: &str,
    defaults: (f64, f64, f64),
) -> anyhow::Result<(String, String, f64, f64, f64)> {
    let (task, rest) = s
        .split_once('=')
        .with_context(|| format!("--task `{s}` must be TASK=FUNCTION[:in=B][:out=B][:code=B]"))?;
    let mut parts = rest.split(':');
    let func = parts.next().unwrap_or_default().trim().to_string();
    if func.is_empty() {
        bail!("--task `{s}`: the function name is missing");
    }
    let (mut din, mut dout, mut code) = defaults;
    for p in parts {
        let (k, v) = p
            .split_once('=')
            .with_context(|| format!("--task `{s}`: `{p}` must be in=B, out=B or code=B"))?;
        let v: f64 = v
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .with_context(|| format!("--task `{s}`: `{v}` is not a size in bytes (>= 0)"))?;
        match k {
            "in" => din = v,
            "out" => dout = v,
            "code" => code = v,
            _ => bail!("--task `{s}`: unknown size `{k}` (use in, out or code)"),
        }
    }
    Ok((task.trim().to_string(), func, din, dout, code))
}

fn read(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {what} {}", path.display()))
}

fn load_machines(path: &Path) -> anyhow::Result<MachineModel> {
    let text = read(path, "machine model")?;
    let is_json =
        path.extension().is_some_and(|e| e == "json") || text.trim_start().starts_with('{');
    if is_json {
        MachineModel::from_json(&text).with_context(|| format!("in {}", path.display()))
    } else {
        let doc: AppendixB = text
            .parse()
            .with_context(|| format!("in {}", path.display()))?;
        let mm = MachineModel::from_appendix_b(&doc);
        mm.validate()
            .with_context(|| format!("in {}", path.display()))?;
        Ok(mm)
    }
}

fn name_values<T: std::str::FromStr>(
    items: &[String],
    what: &str,
) -> anyhow::Result<Vec<(String, T)>> {
    items
        .iter()
        .map(|s| {
            let (n, v) = s
                .split_once('=')
                .with_context(|| format!("{what} `{s}` must be NAME=VALUE"))?;
            let v = v
                .trim()
                .parse::<T>()
                .map_err(|_| anyhow::anyhow!("{what} `{s}`: `{v}` is not a valid value"))?;
            Ok((n.trim().to_string(), v))
        })
        .collect()
}

/// Run `mutirao predict`.
pub fn run(a: PredictArgs) -> anyhow::Result<ExitCode> {
    match a.sub {
        Some(PredictCommand::Analyse {
            file,
            function,
            args,
            policy: p,
            q,
            task_def,
            json,
        }) => {
            let src = read(&file, "Rust source")?;
            let args: Vec<(String, f64)> = name_values(&args, "--arg")?;
            let an = analyse::analyse(&src, &function, &args)
                .with_context(|| format!("in {}", file.display()))?;
            let counts = an.counts(policy(p, q)?)?;
            if let Some(name) = task_def {
                print!("{}", an.task_def(&name));
            } else if json {
                let v = serde_json::json!({
                    "function": function,
                    "counts": counts,
                    "total_ops": counts.values().sum::<f64>(),
                    "pamela": an.to_pamela(),
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "// {}: cost of `{function}` (Extended-PAMELA taskrun body)",
                    file.display()
                );
                print!("{}", an.to_pamela());
                println!("// op × type counts:");
                for (k, v) in &counts {
                    println!("//   {k:<16} {v}");
                }
                println!("//   {:<16} {}", "total", counts.values().sum::<f64>());
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(PredictCommand::Shares {
            weights,
            tasks,
            fraction,
            json,
        }) => {
            let s = shares::static_shares(&weights, tasks, fraction)?;
            let raw = shares::thesis_ceilings(&weights, tasks, fraction)?;
            if json {
                let v = serde_json::json!({ "shares": s, "thesis_ceilings": raw, "total": s.iter().sum::<u64>() });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let line = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
                println!("{}", line(&s));
                if raw != s {
                    eprintln!(
                        "note: the raw ceilings {} sum to {}; rounded to sum to {}",
                        line(&raw),
                        raw.iter().sum::<u64>(),
                        s.iter().sum::<u64>()
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(PredictCommand::Flow { file, cards }) => {
            let text = read(&file, "PASL file")?;
            let spec = pasl::parse(&text).with_context(|| format!("in {}", file.display()))?;
            let binds: HashMap<String, u64> = name_values(&cards, "--card")?.into_iter().collect();
            let dag = spec
                .dag(&binds)
                .with_context(|| format!("in {}", file.display()))?;
            for (k, n) in dag.nodes.iter().enumerate() {
                let succ: Vec<String> = dag.succ[k].iter().map(|s| format!("B{}", s + 1)).collect();
                println!(
                    "B{} {} {} c={} -> [{}]",
                    k + 1,
                    n.task,
                    n.class,
                    n.c,
                    succ.join(", ")
                );
            }
            let l = dag
                .series_parallel()
                .with_context(|| format!("in {}", file.display()))?;
            println!("L = {l}");
            Ok(ExitCode::SUCCESS)
        }
        Some(PredictCommand::Generate {
            file,
            source,
            tasks,
            cards,
            data_in,
            data_out,
            code_size,
            output,
        }) => {
            let text = read(&file, "PASL file")?;
            let spec = pasl::parse(&text).with_context(|| format!("in {}", file.display()))?;
            let binds: HashMap<String, u64> = name_values(&cards, "--card")?.into_iter().collect();
            let dag = spec
                .dag(&binds)
                .with_context(|| format!("in {}", file.display()))?;
            let src = read(&source, "Rust source")?;
            let mut by_task = HashMap::new();
            for t in &tasks {
                let (task, func, din, dout, code) = task_spec(t, (data_in, data_out, code_size))?;
                if !dag.nodes.iter().any(|n| n.task == task) {
                    bail!("--task `{t}`: the flow has no task `{task}`");
                }
                if by_task
                    .insert(task.clone(), (func, din, dout, code))
                    .is_some()
                {
                    bail!("--task `{task}` is given twice");
                }
            }
            let mut costs = Vec::new();
            for n in &dag.nodes {
                let Some((func, din, dout, code)) = by_task.get(&n.task) else {
                    bail!(
                        "no --task for flow task `{}` (batch {}, {}); add --task {}=FUNCTION",
                        n.task,
                        n.batch,
                        n.class,
                        n.task
                    );
                };
                let an = analyse::analyse(&src, func, &[]).with_context(|| {
                    format!(
                        "in {} (function `{func}` of task {})",
                        source.display(),
                        n.task
                    )
                })?;
                costs.push(amgen::BatchCost {
                    taskrun: an.to_pamela(),
                    code_size: *code,
                    data_in: *din,
                    data_out: *dout,
                });
            }
            let model = amgen::generate(&dag, &costs)?;
            // Check that what we write compiles.
            let parsed =
                pamela::parse(&model).context("internal: the generated model does not parse")?;
            analytic::compile(&parsed).context("the generated model does not compile")?;
            match output {
                Some(path) => {
                    write_atomic(&path, &model)?;
                    eprintln!("wrote {}", path.display());
                }
                None => print!("{model}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(PredictCommand::Machine(m)) => crate::cmd_predict_machine::run(m),
        Some(PredictCommand::Error {
            interval,
            runs,
            json,
        }) => score(&interval, &runs, json),
        None => predict(a),
    }
}

/// `predict error`: Eq. 5.2 per run, Eq. 5.3 over the runs, hits, and the centre's error.
fn score(interval: &str, runs: &[f64], json: bool) -> anyhow::Result<ExitCode> {
    let (lo, hi) = interval
        .split_once(',')
        .with_context(|| format!("--interval `{interval}` must be T_MIN,T_MAX"))?;
    let num = |x: &str| -> anyhow::Result<f64> {
        x.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .with_context(|| format!("--interval `{interval}`: `{x}` is not a time in seconds"))
    };
    let iv = mutirao_predict::interval::Interval::new(num(lo)?, num(hi)?)
        .with_context(|| format!("--interval `{interval}`"))?;
    if iv.mid() <= 0.0 {
        bail!("--interval `{interval}`: the interval's centre must be above 0");
    }
    if let Some(t) = runs.iter().find(|t| !(t.is_finite() && **t >= 0.0)) {
        bail!("run time {t} is not a time in seconds");
    }
    let errors: Vec<f64> = runs
        .iter()
        .map(|&t| mutirao_predict::harness::run_error(iv, t))
        .collect();
    let mean_abs = mutirao_predict::harness::mean_abs_error(iv, runs);
    let hits = errors.iter().filter(|e| **e == 0.0).count();
    let mean_run = runs.iter().sum::<f64>() / runs.len() as f64;
    let centre_error = (mean_run - iv.mid()) / iv.mid();
    if json {
        let v = serde_json::json!({
            "t_min_s": iv.lo,
            "t_max_s": iv.hi,
            "centre_s": iv.mid(),
            "runs_s": runs,
            "errors": errors,
            "mean_abs_error": mean_abs,
            "inside": hits,
            "runs": runs.len(),
            "mean_run_s": mean_run,
            "centre_error": centre_error,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let es: Vec<String> = errors
            .iter()
            .map(|e| {
                if *e == 0.0 {
                    "0".to_string()
                } else {
                    format!("{:.3}", e * 100.0)
                }
            })
            .collect();
        println!(
            "E = {} %   mean |E| = {:.3} %   inside {hits}/{}   centre {}, mean run {:.4} ({:+.2} %)",
            es.join(" "),
            mean_abs * 100.0,
            runs.len(),
            iv.mid(),
            mean_run,
            centre_error * 100.0
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn predict(a: PredictArgs) -> anyhow::Result<ExitCode> {
    let (Some(app), Some(machines)) = (&a.app, &a.machines) else {
        bail!("give --app MODEL and --machines MACHINES (or a subcommand: analyse, shares, flow, generate, machine); see `mutirao predict --help`");
    };
    let pol = policy(a.policy, a.q)?;
    let text = read(app, "application model")?;
    let model = pamela::parse(&text).with_context(|| format!("in {}", app.display()))?;
    let compiled = analytic::compile(&model).with_context(|| format!("in {}", app.display()))?;
    let mm = load_machines(machines)?;
    let sel = if let Some(h) = &a.hosts {
        Selection::Explicit(h.clone())
    } else if let Some(l) = &a.like {
        let (m, p) = l
            .split_once(':')
            .with_context(|| format!("--like `{l}` must be M:P (machine index : count)"))?;
        let like = m
            .trim()
            .parse()
            .with_context(|| format!("--like `{l}`: `{m}` is not a machine index"))?;
        let p = p
            .trim()
            .parse()
            .with_context(|| format!("--like `{l}`: `{p}` is not a count"))?;
        Selection::Homogeneous { p, like }
    } else {
        let all = mm
            .workers_by_speed()
            .with_context(|| format!("in {}", machines.display()))?;
        Selection::Fastest(a.procs.unwrap_or(all.len()))
    };
    let pred = analytic::evaluate(&compiled, &mm, &sel, pol)
        .with_context(|| format!("predicting {} on {}", app.display(), machines.display()))?;
    if a.json {
        let v = serde_json::json!({
            "format": "mutirao-prediction/1",
            "t_min_s": pred.interval.lo,
            "t_max_s": pred.interval.hi,
            "policy": format!("{pol:?}"),
            "prediction": pred,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_human(&pred, pol);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_human(p: &Prediction, pol: Policy) {
    println!(
        "T = [{:.6}; {:.6}] s   (P = {}, workers {:?}, policy {:?})",
        p.interval.lo,
        p.interval.hi,
        p.workers.len(),
        p.workers,
        pol
    );
    println!(
        "{:<16} {:>14} {:>14}  meaning",
        "term", "t_min (s)", "t_max (s)"
    );
    for t in &p.terms {
        let mark = if t.name == p.dominant_max { " *" } else { "" };
        let arg = t
            .argmax_worker
            .map(|w| format!(" (worst worker: {w})"))
            .unwrap_or_default();
        println!(
            "{:<16} {:>14.6} {:>14.6}  {}{}{}",
            t.name, t.value.lo, t.value.hi, t.meaning, arg, mark
        );
    }
    println!(
        "dominant: {} at t_max, {} at t_min; predicted speedup {:.3}, efficiency {:.3}",
        p.dominant_max, p.dominant_min, p.speedup, p.efficiency
    );
    for (n, s) in &p.shares {
        println!("shares of {n} tasks: {s:?}");
    }
    for f in &p.fallbacks {
        println!(
            "fallback: machine {} has no `{}`; used `{}`",
            f.machine, f.wanted, f.used
        );
    }
}
