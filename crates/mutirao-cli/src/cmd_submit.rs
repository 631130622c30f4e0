//! The grid's client commands: `mutirao submit`, `jobs`, `job`, `logs`, `cancel` — thin shells
//! over `mutirao_coord::client::Client`.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use mutirao_coord::api::SubmitRequest;
use mutirao_coord::client::Client;
use mutirao_coord::{Job, JobState};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Where the coordinator is and who you are.
#[derive(Args, Clone)]
pub struct ConnArgs {
    /// The coordinator's URL (default: $MUTIRAO_COORD, else http://127.0.0.1:7210).
    #[arg(long, value_name = "URL")]
    coord: Option<String>,
    /// Your token (default: $MUTIRAO_COORD_TOKEN; a flag is visible to other local users in
    /// `ps`, the variable is not).
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
}

impl ConnArgs {
    fn client(&self) -> anyhow::Result<Client> {
        let url = self
            .coord
            .clone()
            .or_else(|| std::env::var("MUTIRAO_COORD").ok())
            .unwrap_or_else(|| "http://127.0.0.1:7210".into());
        let token = self
            .token
            .clone()
            .or_else(|| std::env::var("MUTIRAO_COORD_TOKEN").ok())
            .unwrap_or_default();
        if token.is_empty() {
            bail!("no token: set MUTIRAO_COORD_TOKEN (or pass --token); your grid administrator gives you one (the coordinator's token file)");
        }
        Ok(Client::new(&url, &token)?)
    }
}

#[derive(Subcommand)]
pub enum GridCommand {
    /// Submit a program to the grid: upload it, queue it as a job of N ranks.
    ///
    /// The program file is uploaded to the coordinator's application repository, named by its
    /// SHA-256 digest (agents check the digest before running it), then queued as a job.
    ///
    /// Examples:
    ///   export MUTIRAO_COORD=http://127.0.0.1:7210 MUTIRAO_COORD_TOKEN=...
    ///   mutirao submit -n 8 ./matmul 2000
    ///   mutirao submit -n 8 --require 'cpu>=2 & site=north' --checkpoint-interval 60 -- ./solver --tol 1e-9
    ///   mutirao submit -n 4 --env OMP_NUM_THREADS=1 --env HOME ./matmul 2000
    ///
    /// Task graphs: `--dag GRAPH.json` submits a `mutirao-taskgraph/1` document instead of a
    /// program: tasks are commands (argv), edges hand files from a task to its successors
    /// (through the coordinator's repository), and a task's own `files` (paths relative to the
    /// graph, e.g. a program) are uploaded; the coordinator maps tasks to eligible hosts
    /// with `--algo` over its calibrated model (round-robin without one), journals the
    /// predicted makespan, and starts each task when its predecessors have finished. The graph
    /// is checked here first: a malformed one is refused with the task, edge or field named
    /// and nothing is uploaded. Format: docs/grid.md, "Task graphs".
    ///   mutirao submit --dag diamond.json --algo hlogp-heft --require 'cpu>=1'
    ///
    /// Prints the job's id; follow it with `mutirao job ID` and `mutirao logs ID --follow`
    /// (a task graph's output is tagged with each task's id; `job ID --why` shows the mapping,
    /// the predicted makespan and the hosts refused).
    #[command(verbatim_doc_comment)]
    Submit(SubmitArgs),
    /// List your jobs on the grid, newest first.
    Jobs {
        #[command(flatten)]
        conn: ConnArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Show at most the newest N jobs.
        #[arg(long, default_value_t = 100, value_name = "N", conflicts_with = "all")]
        limit: u64,
        /// Show every job.
        #[arg(long)]
        all: bool,
    },
    /// Show one of your grid jobs and its journal (every state change and event).
    Job {
        /// The job's id.
        id: i64,
        /// Explain the placement: the requirement, the hosts chosen and refused, and why.
        #[arg(long)]
        why: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Print a grid job's output; with --follow, keep printing until the job ends.
    Logs {
        /// The job's id.
        id: i64,
        /// Wait for more output until the job is finished, failed or cancelled.
        #[arg(long, short = 'f')]
        follow: bool,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Cancel one of your grid jobs.
    Cancel {
        /// The job's id.
        id: i64,
        #[command(flatten)]
        conn: ConnArgs,
    },
}

#[derive(Args)]
pub struct SubmitArgs {
    /// Number of ranks.
    #[arg(
        short = 'n',
        long = "ranks",
        value_name = "N",
        required_unless_present = "dag"
    )]
    ranks: Option<u32>,
    /// Submit a task graph (`mutirao-taskgraph/1` JSON) instead of a program.
    #[arg(long, value_name = "GRAPH.json", conflicts_with_all = ["ranks", "checkpoint_interval", "command"])]
    dag: Option<PathBuf>,
    /// With --dag: how tasks are mapped to hosts (hlogp-heft, heft, round-robin; default
    /// hlogp-heft; without a model the coordinator deals them round-robin).
    #[arg(long, value_name = "ALGO", requires = "dag")]
    algo: Option<String>,
    /// Requirement on hosts, terms joined by `&`: `cpu` (idle cores), `mem` (free MiB), `load`,
    /// `name`, or a property agents declare (`--site`, `--prop`), compared with >= <= > < = !=,
    /// e.g. 'cpu>=2 & site=north & gpu>=1'. Text compares with = and != only.
    #[arg(long, value_name = "EXPR")]
    require: Option<String>,
    /// Seconds between checkpoint waves (programs with checkpoint points).
    #[arg(long, value_name = "S")]
    checkpoint_interval: Option<f64>,
    /// Set an environment variable for every rank (or task): `KEY=VALUE`, or `KEY` to pass
    /// this shell's value. Repeatable. Names are a letter or _ followed by letters, digits and
    /// _; `MUTIRAO_*` names are the runtime's own and are refused.
    #[arg(long = "env", value_name = "KEY[=VALUE]")]
    env: Vec<String>,
    #[command(flatten)]
    conn: ConnArgs,
    /// The program (a file here; it is uploaded) and its arguments.
    #[arg(
        required_unless_present = "dag",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROG ARGS"
    )]
    command: Vec<String>,
}

fn age(ms: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let s = ((now - ms) / 1000).max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// The `--env` items as a job's environment, checked as the coordinator checks them (so a bad
/// one is refused before anything is uploaded). `KEY` alone takes this process's value.
pub fn job_env(
    items: &[String],
    lookup: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut env = BTreeMap::new();
    for item in items {
        let (k, v) = match item.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => {
                let v = lookup(item).with_context(|| {
                    format!("--env {item}: no such variable in this environment; give its value with --env {item}=VALUE")
                })?;
                (item.clone(), v)
            }
        };
        mutirao_coord::check_env_key(&k).map_err(|e| anyhow::anyhow!("--env: {e}"))?;
        if env.insert(k.clone(), v).is_some() {
            bail!("--env {k} is given twice");
        }
    }
    mutirao_coord::check_env(&env).map_err(|e| anyhow::anyhow!("--env: {e}"))?;
    Ok(env)
}

/// A job's environment as `K=V` words (empty when it has none).
fn env_words(env: &BTreeMap<String, String>) -> String {
    env.iter()
        .map(|(k, v)| format!("{k}={v} "))
        .collect::<String>()
}

fn short(digest: &str) -> &str {
    digest.get(..19).unwrap_or(digest)
}

fn print_jobs(jobs: &[Job]) {
    println!(
        "{:>6}  {:<13} {:>5}  {:>5}  PROGRAM",
        "ID", "STATE", "RANKS", "AGE"
    );
    for j in jobs {
        println!(
            "{:>6}  {:<13} {:>5}  {:>5}  {}{} {}",
            j.id,
            j.state,
            j.spec.ranks,
            age(j.created_ms),
            env_words(&j.spec.env),
            short(&j.spec.program),
            j.spec.args.join(" ")
        );
    }
}

pub fn run(c: GridCommand) -> anyhow::Result<ExitCode> {
    match c {
        GridCommand::Submit(a) => submit(a),
        GridCommand::Jobs {
            conn,
            json,
            limit,
            all,
        } => {
            let client = conn.client()?;
            let limit = limit.max(1);
            let jobs = if all {
                client.jobs()?
            } else {
                client.jobs_newest(limit)?
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&jobs)?);
            } else if jobs.is_empty() {
                println!("no jobs; submit one with `mutirao submit -n N PROG ARGS`");
            } else {
                print_jobs(&jobs);
                if !all && jobs.len() as u64 == limit {
                    println!("(the newest {limit}; --all for every job, --limit N for more)");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        GridCommand::Job {
            id,
            why,
            json,
            conn,
        } => {
            let v = conn.client()?.job(id)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(ExitCode::SUCCESS);
            }
            let s = &v.job.spec;
            if s.dag {
                println!(
                    "job {}: {} (task graph of {} tasks), owner {}",
                    v.job.id, v.job.state, s.ranks, s.owner
                );
                let algo = s.args.first().map_or("hlogp-heft", String::as_str);
                println!("task graph {} (algorithm {algo})", s.program);
            } else {
                println!(
                    "job {}: {} ({} ranks), owner {}",
                    v.job.id, v.job.state, s.ranks, s.owner
                );
                println!("program {} {}", s.program, s.args.join(" "));
            }
            if let Some(r) = &s.require {
                println!("requires {r}");
            }
            if let Some(i) = s.checkpoint_interval_s {
                println!("checkpoint every {i} s");
            }
            if !s.env.is_empty() {
                println!("environment {}", env_words(&s.env).trim_end());
            }
            if why {
                let reasons: Vec<_> = v.events.iter().filter(|e| e.kind != "state").collect();
                if reasons.is_empty() {
                    println!("no placement decision recorded yet (the job is {}; the coordinator journals the hosts chosen and refused when it places it)", v.job.state);
                } else {
                    println!("placement:");
                    for e in reasons {
                        println!("  {:<10} {}", e.kind, e.detail);
                    }
                }
            } else {
                println!("journal:");
                for e in &v.events {
                    let what = match e.to {
                        Some(s) => format!("-> {s}"),
                        None => e.kind.clone(),
                    };
                    println!(
                        "  {:>3} {:>6} ago  {:<16} {}",
                        e.seq,
                        age(e.at_ms),
                        what,
                        e.detail
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        GridCommand::Logs { id, follow, conn } => {
            let client = conn.client()?;
            let mut offset = 0u64;
            let mut out = std::io::stdout().lock();
            loop {
                let r = client.read_log(id, offset, if follow { 25_000 } else { 0 })?;
                offset += r.data.len() as u64;
                out.write_all(&r.data)?;
                out.flush()?;
                if r.data.is_empty() && (!follow || r.state.is_final()) {
                    if follow {
                        eprintln!("mutirao: job {id} is {}", r.state);
                        if r.state != JobState::Finished {
                            return Ok(ExitCode::from(1));
                        }
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                if !follow && offset >= r.length {
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
        GridCommand::Cancel { id, conn } => {
            let j = conn.client()?.cancel(id)?;
            println!("job {}: {}", j.id, j.state);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn submit_dag(a: SubmitArgs, path: PathBuf) -> anyhow::Result<ExitCode> {
    use mutirao_coord::taskgraph::{algorithm, TaskGraph};
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the task graph {}", path.display()))?;
    let refuse = |e: String| anyhow::anyhow!("{}: {e}; nothing was submitted", path.display());
    let mut g: TaskGraph = serde_json::from_str(&text)
        .map_err(|e| refuse(format!("not a mutirao-taskgraph/1 document: {e}")))?;
    // Tasks' own files are local paths here (relative to the graph's directory): read them all
    // before uploading anything, so that a missing one changes nothing.
    let base = path.parent().unwrap_or(std::path::Path::new("."));
    let mut local: Vec<(usize, String, Vec<u8>)> = Vec::new();
    for (i, t) in g.tasks.iter().enumerate() {
        for (name, p) in &t.files {
            if mutirao_coord::repo::check_digest(p).is_ok() {
                continue;
            }
            let file = base.join(p);
            let bytes = std::fs::read(&file).map_err(|e| {
                refuse(format!(
                    "task {:?}: file {name:?}: cannot read {}: {e}",
                    t.id,
                    file.display()
                ))
            })?;
            local.push((i, name.clone(), bytes));
        }
    }
    for (i, name, bytes) in &local {
        g.tasks[*i]
            .files
            .insert(name.clone(), mutirao_coord::repo::digest_of(bytes));
    }
    g.validate().map_err(refuse)?;
    let env = job_env(&a.env, &|k| std::env::var(k).ok())?;
    let args: Vec<String> = a.algo.into_iter().collect();
    algorithm(&args).map_err(|e| anyhow::anyhow!("--algo: {e}"))?;
    let client = a.conn.client()?;
    for (i, name, bytes) in &local {
        let up = client.upload(bytes)?;
        eprintln!(
            "mutirao: uploaded task {:?}'s file {name} ({} bytes) as {}",
            g.tasks[*i].id, up.size, up.digest
        );
    }
    let text = serde_json::to_string_pretty(&g)?;
    let up = client.upload(text.as_bytes())?;
    let job = client.submit(&SubmitRequest {
        ranks: g.tasks.len() as u32,
        program: up.digest.clone(),
        args,
        require: a.require,
        checkpoint_interval_s: None,
        dag: true,
        env,
    })?;
    eprintln!(
        "mutirao: uploaded the task graph {} ({} tasks) as {}",
        path.display(),
        g.tasks.len(),
        up.digest
    );
    println!("{}", job.id);
    Ok(ExitCode::SUCCESS)
}

fn submit(a: SubmitArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = a.dag.clone() {
        return submit_dag(a, path);
    }
    let ranks = a.ranks.context("give the number of ranks with -n N")?;
    let env = job_env(&a.env, &|k| std::env::var(k).ok())?;
    let client = a.conn.client()?;
    let (prog, args) = a.command.split_first().context("no program given")?;
    let path = PathBuf::from(prog);
    let bytes = std::fs::read(&path).with_context(|| {
        format!("cannot read the program {prog}: give a path to a file (it is uploaded to the coordinator's repository)")
    })?;
    let up = client.upload(&bytes)?;
    let job = client.submit(&SubmitRequest {
        ranks,
        program: up.digest.clone(),
        args: args.to_vec(),
        require: a.require,
        checkpoint_interval_s: a.checkpoint_interval,
        dag: false,
        env,
    })?;
    eprintln!(
        "mutirao: uploaded {prog} ({} bytes) as {}",
        up.size, up.digest
    );
    println!("{}", job.id);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::job_env;

    fn items(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn env_items_set_forward_and_refuse_reserved_or_malformed_names() {
        let shell = |k: &str| (k == "HOME").then(|| "/home/ana".to_string());
        let env = job_env(&items(&["A=1", "HOME", "B=x=y", "E="]), &shell).unwrap();
        let got: Vec<(&str, &str)> = env.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        assert_eq!(
            got,
            [("A", "1"), ("B", "x=y"), ("E", ""), ("HOME", "/home/ana")]
        );
        for (bad, why) in [
            ("MUTIRAO_RANK=1", "reserved"),
            ("Mutirao_Job_Id=1", "reserved"),
            ("=1", "a name is"),
            ("A B=1", "a name is"),
            ("9A=1", "a name is"),
            ("UNSET_HERE", "no such variable"),
            ("V=a\0b", "NUL"),
        ] {
            let e = job_env(&items(&[bad]), &shell).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        let e = job_env(&items(&["A=1", "A=2"]), &shell)
            .unwrap_err()
            .to_string();
        assert!(e.contains("given twice"), "{e}");
    }
}
