//! `mutirao coordinator`: the grid coordinator (jobs, journals, logs, hosts, the application
//! repository) behind an authenticated HTTP + JSON API. A thin shell over `mutirao-coord`.

use anyhow::{bail, Context};
use clap::Args;
use mutirao_coord::api::{serve_blocking, Coordinator};
use mutirao_coord::auth::Tokens;
use mutirao_coord::exec::{Dispatcher, LaunchExecutor};
use mutirao_coord::{PgStore, Repo, SqliteStore, Store};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The grid coordinator: jobs, hosts and the application repository behind an HTTP API.
///
/// Users submit jobs to it (`mutirao submit`); agents register and heartbeat to it.
///
/// Principals come from a token file, one a line: `user NAME TOKEN` or `agent HOSTNAME TOKEN`
/// (tokens at least 16 characters; make one with `head -c 24 /dev/urandom | base64`). Users
/// see and cancel only their own jobs; an agent reports only its own host.
///
/// State lives in SQLite by default (one file, survives restarts) or in PostgreSQL. Programs
/// and inputs live in a content-addressed repository directory.
///
/// Submitted jobs are placed on registered, alive hosts whose owner is away and which meet
/// the job's --require (cpu, mem, load of the agents' reports, and the properties agents declare with --site and --prop), then run with `mutirao run`
/// through those hosts' agents; their output goes to the job's log, their end to its state.
///
/// Examples:
///   mutirao coordinator --tokens grid.tokens
///   mutirao coordinator --listen 127.0.0.1:7210 --db /var/lib/mutirao/coord.sqlite --tokens /etc/mutirao/grid.tokens
///   mutirao coordinator --postgres 'host=/run/postgresql user=mutirao dbname=grid' --tokens grid.tokens
///
/// The API is described at GET /openapi.json. Stop it with Ctrl-C or SIGTERM.
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct CoordArgs {
    /// Address to listen on (loopback by default: the API is plain HTTP, so put a TLS proxy
    /// in front before exposing it).
    #[arg(long, default_value = "127.0.0.1:7210", value_name = "ADDR")]
    listen: SocketAddr,
    /// SQLite database file (created and migrated if needed).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "mutirao-coord.sqlite",
        conflicts_with = "postgres"
    )]
    db: PathBuf,
    /// PostgreSQL connection string instead of SQLite (`host=/run/postgresql user=u dbname=d`
    /// or `postgresql://u@host/d`).
    #[arg(long, value_name = "URL")]
    postgres: Option<String>,
    /// Token file naming the users and agents (or set MUTIRAO_COORD_TOKENS).
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// Directory of the application repository (default: the database's name + `.repo`).
    #[arg(long, value_name = "DIR")]
    repo: Option<PathBuf>,
    /// Largest program or input accepted, in MiB.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    max_upload_mib: u64,
    /// Directory where placed jobs get their program, hostfile and checkpoints (default: the
    /// database's name + `.jobs`).
    #[arg(long, value_name = "DIR")]
    jobs_dir: Option<PathBuf>,
    /// How often agents are asked to report, seconds (a host is lost after three silent
    /// periods; the owner's suspend and vacate are seen within one).
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    heartbeat_interval: f64,
    /// A calibrated model (`mutirao-model/1` JSON, from `mutirao fit`): SPMD jobs are then
    /// placed speed-proportionally (fastest free cores first, more ranks to faster hosts) and
    /// the predicted makespan is journalled. Hosts it does not name count as its slowest.
    /// Task graphs (`submit --dag`) are mapped with the job's scheduler (hlogp-heft by
    /// default) over the model restricted to the eligible hosts it names.
    #[arg(long, value_name = "FILE")]
    model: Option<PathBuf>,
    /// Where the hosts' usage history (idle by hour of the week, learnt from heartbeats) is
    /// kept (default: the database's name + `.usage.json`); saved every minute and at exit.
    #[arg(long, value_name = "FILE")]
    usage_file: Option<PathBuf>,
    /// The agents' shared secret, for starting ranks through them (default:
    /// $MUTIRAO_AGENT_TOKEN_FILE or ~/.mutirao/agent.token, as `mutirao run`).
    #[arg(long, value_name = "FILE")]
    agent_token_file: Option<PathBuf>,
    /// Seconds a client has to send a request's whole header (an idle kept-alive connection
    /// too); then its connection is closed.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    header_timeout: f64,
    /// Connections served at once; one more is answered 503 and closed at once.
    #[arg(long, default_value_t = mutirao_coord::api::DEFAULT_MAX_CONNECTIONS, value_name = "N")]
    max_connections: usize,
    /// Content each user may have uploaded to the repository, in MiB (507 past it).
    #[arg(long, default_value_t = 4096, value_name = "MIB")]
    upload_quota_mib: u64,
    /// Output a job's log keeps, in MiB; past it the log gets one notice and further output
    /// is dropped (the job's journal says how much).
    #[arg(long, default_value_t = 64, value_name = "MIB")]
    log_cap_mib: u64,
}

pub fn run(a: CoordArgs) -> anyhow::Result<ExitCode> {
    let tokens_path = match a.tokens.clone().or_else(|| std::env::var_os("MUTIRAO_COORD_TOKENS").map(PathBuf::from)) {
        Some(p) => p,
        None => bail!("no token file: pass --tokens FILE (or set MUTIRAO_COORD_TOKENS); each line is `user NAME TOKEN` or `agent HOSTNAME TOKEN`"),
    };
    let tokens = Tokens::load(&tokens_path)?;
    if tokens.is_empty() {
        bail!(
            "{} names no principal: every request would be refused; add `user NAME TOKEN` lines",
            tokens_path.display()
        );
    }
    let store: Arc<dyn Store> = match &a.postgres {
        Some(url) => Arc::new(PgStore::connect(url)?),
        None => Arc::new(SqliteStore::open(&a.db)?),
    };
    let beside_db = |ext: &str| match &a.postgres {
        Some(_) => PathBuf::from(format!("mutirao-coord{ext}")),
        None => {
            let mut p = a.db.clone().into_os_string();
            p.push(ext);
            PathBuf::from(p)
        }
    };
    let repo_dir = a.repo.clone().unwrap_or_else(|| beside_db(".repo"));
    let jobs_dir = a.jobs_dir.clone().unwrap_or_else(|| beside_db(".jobs"));
    let repo = Repo::open(&repo_dir, a.max_upload_mib.saturating_mul(1 << 20))?;
    if !a.listen.ip().is_loopback() {
        eprintln!(
            "mutirao coordinator: warning: listening on {} (not loopback); the API is plain HTTP and tokens travel in clear",
            a.listen
        );
    }
    if !(a.heartbeat_interval.is_finite() && (0.05..=3600.0).contains(&a.heartbeat_interval)) {
        bail!(
            "--heartbeat-interval {}: expected seconds between 0.05 and 3600",
            a.heartbeat_interval
        );
    }
    if !(a.header_timeout.is_finite() && (0.1..=3600.0).contains(&a.header_timeout)) {
        bail!(
            "--header-timeout {}: expected seconds between 0.1 and 3600",
            a.header_timeout
        );
    }
    if a.max_connections == 0 {
        bail!("--max-connections 0 would refuse every client; expected at least 1");
    }
    let limits = mutirao_coord::api::Limits {
        header_read_timeout: Duration::from_secs_f64(a.header_timeout),
        max_connections: a.max_connections,
        upload_quota: a.upload_quota_mib.saturating_mul(1 << 20),
        log_cap: a.log_cap_mib.saturating_mul(1 << 20),
    };
    let c = Coordinator::with_limits(
        store,
        tokens,
        repo,
        Duration::from_secs_f64(a.heartbeat_interval),
        limits,
    );
    let exec = LaunchExecutor {
        agent_token_file: a
            .agent_token_file
            .clone()
            .unwrap_or_else(mutirao_launch::proto::default_token_path),
    };
    let usage_file = a
        .usage_file
        .clone()
        .unwrap_or_else(|| beside_db(".usage.json"));
    c.usage().load(&usage_file)?;
    let dispatcher = Dispatcher::install(c.clone(), Arc::new(exec), &jobs_dir)?;
    if let Some(path) = &a.model {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the model {}", path.display()))?;
        let model = mutirao_model::Model::from_json(&text).map_err(|e| {
            anyhow::anyhow!("--model {}: the calibrated model: {e}", path.display())
        })?;
        eprintln!(
            "mutirao coordinator: placing with the calibrated model {} ({} hosts)",
            path.display(),
            model.hosts.len()
        );
        dispatcher.set_calibrated_model(model);
    }
    {
        let (c, path) = (c.clone(), usage_file.clone());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(60));
            if let Err(e) = c.usage().save(&path) {
                eprintln!("mutirao coordinator: {e}");
            }
        });
    }
    // Jobs the previous coordinator left running: decided from what their agents report
    // (finished, re-queued, or held until their ranks are gone), in the background.
    let orphans = dispatcher.reconcile_orphans()?;
    if orphans > 0 {
        eprintln!("mutirao coordinator: {orphans} job(s) left running by the previous coordinator: reconciling with their agents");
    }
    // Hosts come and go: waiting jobs are placed again every 2 s (and at once on submission),
    // or every heartbeat period if shorter; the hosts' owners are followed as often.
    let every = Duration::from_secs(2).min(Duration::from_secs_f64(a.heartbeat_interval));
    let _placing = dispatcher.spawn_loop(every);
    let backend = match &a.postgres {
        Some(_) => "PostgreSQL".to_string(),
        None => a.db.display().to_string(),
    };
    serve_blocking(a.listen, c.clone(), |addr| {
        // The first line is for people and scripts alike (port 0 picks a free port).
        println!(
            "mutirao coordinator: listening on http://{addr} (state: {backend}, repository: {})",
            repo_dir.display()
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
    })
    .context("the coordinator stopped")?;
    c.usage().save(&usage_file)?;
    Ok(ExitCode::SUCCESS)
}
