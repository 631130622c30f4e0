//! `mutirao agent`: one per host. Starts, watches and ends the processes an authenticated launcher
//! asks for, streams their output back and reports how they ended.

use crate::fsutil::write_atomic_mode;
use anyhow::{bail, Context};
use mutirao_launch::agent::{self, AgentConfig};
use mutirao_launch::proto;
use mutirao_launch::sandbox::{private_dir, RunAs, Sandbox};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Run the per-host agent that `mutirao run --hostfile` talks to.
///
/// The agent runs programs only for launchers that prove they hold the shared token (HMAC
/// challenge–response; the token never crosses the network). It listens on loopback unless told
/// otherwise.
///
/// Jobs get nothing of the agent's: a clean environment (the launch's variables, PATH, HOME,
/// TMPDIR), a private directory, and — when the agent runs as root — a uid of their own per
/// job (from --job-uids), so they can read neither the agent's files nor each other's. Give
/// --run-as USER to run every job as one account instead (--run-as root: as root, like the
/// agent; every token holder is then root here).
///
/// Examples:
///   mutirao agent --gen-token ~/.mutirao/agent.token     # once, then copy the file to every host
///   mutirao agent --listen 127.0.0.1:7207
///   mutirao agent --listen 10.1.0.5:7207 --token-file /etc/mutirao/agent.token
///   sudo mutirao agent --coordinator http://10.1.0.1:7210 --coord-token-file /etc/mutirao/coord.token
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct AgentArgs {
    /// Address to listen on. Only loopback unless you name another interface.
    #[arg(long, default_value = "127.0.0.1:7207", value_name = "ADDR")]
    pub listen: String,
    /// The shared secret (default: $MUTIRAO_AGENT_TOKEN_FILE or ~/.mutirao/agent.token).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Write a new random token to FILE (mode 0600) and exit.
    #[arg(long, value_name = "FILE")]
    pub gen_token: Option<PathBuf>,
    /// Print the bound address on stdout once listening (useful with port 0).
    #[arg(long)]
    pub print_addr: bool,
    /// Unix socket of the directory this agent hosts (default /tmp/mutirao-dir-IP-PORT.sock; see
    /// `mutirao dir --help`). Local clients are identified by their uid.
    #[arg(long, value_name = "PATH")]
    pub dir_socket: Option<PathBuf>,
    /// Do not host a directory.
    #[arg(long)]
    pub no_dir: bool,
    /// Address where other agents' directories reach this one (grid-scope queries); none by
    /// default. Servers authenticate each other with the agent token.
    #[arg(long, value_name = "ADDR")]
    pub dir_listen: Option<SocketAddr>,
    /// Another agent's directory address (repeatable).
    #[arg(long, value_name = "ADDR")]
    pub dir_peer: Vec<SocketAddr>,
    /// Where this agent keeps the checkpoint replicas launchers send it (`mutirao run
    /// --checkpoint-store agents`): default $TMPDIR/mutirao-agent-store-IP-PORT, mode 0700.
    #[arg(long, value_name = "DIR")]
    pub store_dir: Option<PathBuf>,
    /// Keep no checkpoint replicas (store requests are refused).
    #[arg(long, conflicts_with = "store_dir")]
    pub no_store: bool,
    /// Register with this grid coordinator (`mutirao coordinator`) and send it resource
    /// reports (idle CPU, memory, load) at the period it asks for; its dispatcher then places
    /// submitted jobs here. A coordinator that is not up yet, or goes away, is tried again
    /// with backoff (1 s up to 30 s): start agents and coordinator in any order. The agent's
    /// coordinator token comes from --coord-token-file (else $MUTIRAO_COORD_TOKEN).
    #[arg(long, value_name = "URL")]
    pub coordinator: Option<String>,
    /// File holding this agent's coordinator token (an `agent` line's token of the
    /// coordinator's token file), mode 0600. Without it the token is taken from
    /// $MUTIRAO_COORD_TOKEN, which the agent then removes from its environment.
    #[arg(long, value_name = "FILE")]
    pub coord_token_file: Option<PathBuf>,
    /// Run every job as this user (the agent must run as root, unless USER is its own).
    /// Default for a root agent: a uid of its own per job (--job-uids); for any other agent:
    /// its own user (it says so at start: jobs can then read its files).
    #[arg(long, value_name = "USER")]
    pub run_as: Option<String>,
    /// The uids a root agent gives its jobs, one per running job, FIRST-LAST (uids of existing
    /// accounts are skipped; agents of one machine share the range through lock files in
    /// /run/mutirao/job-uids).
    #[arg(long, value_name = "FIRST-LAST", default_value = "60000-60999", value_parser = parse_uid_range)]
    pub job_uids: (u32, u32),
    /// Where jobs get their private directories (their HOME, TMPDIR and, on a grid, working
    /// directory; each removed when its job ends): default $TMPDIR/mutirao-agent-jobs-IP-PORT,
    /// mode 0711. Job uids must be able to reach it.
    #[arg(long, value_name = "DIR")]
    pub jobs_dir: Option<PathBuf>,
    /// The name this host registers under (default: its host name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// This host's site, reported to the coordinator: `submit --require 'site=north'` matches
    /// it (the same as --prop site=NAME).
    #[arg(long, value_name = "NAME")]
    pub site: Option<String>,
    /// A property of this host reported to the coordinator, KEY=VALUE (repeat it), e.g.
    /// `--prop arch=x86_64 --prop gpu=1`: `submit --require 'arch=x86_64 & gpu>=1'` matches it.
    #[arg(long = "prop", value_name = "KEY=VALUE", value_parser = parse_prop)]
    pub props: Vec<(String, String)>,
    /// The resource hierarchy this host belongs to (a mεμ spec, e.g. the testbed's NAME.meu;
    /// see `mutirao resources`): the properties of its domain named as this host (--name)
    /// and the name of its nearest `site` ancestor go into the reports, so `submit --require`
    /// matches them (`cpu_milli>=500 & site=a`). --site and --prop override them; keys the
    /// agent measures itself (cpu, mem, load, name) are not taken from it.
    #[arg(long, value_name = "FILE")]
    pub resources: Option<PathBuf>,
    /// The host owner's policy (TOML; see docs/grid.md, "Owner policy"): when the owner is
    /// active (own load, keyboard, hours, an owner-active file) the grid's processes here are
    /// stopped (SIGSTOP) and continued (SIGCONT) when the owner leaves; past the policy's grace
    /// period the coordinator moves the job elsewhere (without --coordinator, the agent kills
    /// them: `mutirao run --checkpoint-interval` restarts them on its other hosts). Reported in
    /// every heartbeat.
    #[arg(long, value_name = "FILE")]
    pub owner_policy: Option<PathBuf>,
    /// With --coordinator: where programs fetched from the coordinator's repository are cached
    /// by digest, and where ranks run whose job directory this host does not have (default:
    /// $TMPDIR/mutirao-agent-programs-IP-PORT, mode 0700). Every program is checked against its
    /// digest right before it runs; an altered copy is removed and the launch refused.
    #[arg(long, value_name = "DIR")]
    pub program_cache: Option<PathBuf>,
    /// With --coordinator: where the agent keeps its state across restarts — the journal of
    /// the grid ranks it runs (`ranks.json`: each rank's job and run, alive or how it ended,
    /// kept an hour; reported in every heartbeat, so a restarted coordinator learns what became
    /// of its jobs) and its host's usage history (`usage.json`). Default: the --program-cache
    /// directory.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Node number in the directory's resource ids (default: derived from the listen port).
    #[arg(long, value_name = "N")]
    pub dir_node: Option<u16>,
}

/// Host the directory service in a thread of the agent; returns its Unix socket (the ranks this
/// agent starts get it as `MUTIRAO_DIR_SOCKET`).
fn start_directory(args: &AgentArgs, bound: SocketAddr, secret: &[u8]) -> anyhow::Result<PathBuf> {
    use mutirao_dir::server::{run_blocking, ServerConfig};
    let sock = args
        .dir_socket
        .clone()
        // Named after the whole listen address: agents of several testbed hosts share /tmp.
        .unwrap_or_else(|| {
            PathBuf::from(format!(
                "/tmp/mutirao-dir-{}-{}.sock",
                bound.ip(),
                bound.port()
            ))
        });
    if sock.exists() {
        // A stale socket of a previous agent on this port: replace it.
        let _ = std::fs::remove_file(&sock);
    }
    let cfg = ServerConfig {
        dir: mutirao_dir::DirConfig {
            node: u64::from(args.dir_node.unwrap_or(bound.port())),
            ..Default::default()
        },
        peers: args.dir_peer.clone(),
        cluster_key: secret.to_vec(),
        ..ServerConfig::default()
    };
    let listen = args.dir_listen;
    let socket = sock.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("agent-directory".into())
        .spawn(move || {
            let shown = sock.display().to_string();
            let tx2 = tx.clone();
            let res = run_blocking(cfg, Some(sock), listen, move |peer| {
                log(&format!(
                    "directory on {shown} (peers on {})",
                    peer.map_or("-".into(), |p| p.to_string())
                ));
                let _ = tx2.send(Ok(()));
            });
            if let Err(e) = res {
                let _ = tx.send(Err(e.to_string()));
            }
        })?;
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(())) => Ok(socket),
        Ok(Err(e)) => bail!("cannot start the directory: {e} (use --no-dir to run without it)"),
        Err(_) => bail!("the directory did not start within 10 s"),
    }
}

fn log(msg: &str) {
    eprintln!("mutirao agent: {msg}");
}

/// `FIRST-LAST` of `--job-uids`.
fn parse_uid_range(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{s:?}: expected FIRST-LAST, e.g. 60000-60999");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let first: u32 = a.trim().parse().map_err(|_| bad())?;
    let last: u32 = b.trim().parse().map_err(|_| bad())?;
    if first < 1000 || first > last || last >= 65_534 {
        return Err(format!(
            "{s:?}: give 1000 <= FIRST <= LAST < 65534 (below 1000 are system accounts, 65534 is nobody)"
        ));
    }
    Ok((first, last))
}

/// The agent's coordinator token: from `--coord-token-file`, else `$MUTIRAO_COORD_TOKEN`
/// (removed from this process's environment once read).
fn coord_token(args: &AgentArgs) -> anyhow::Result<String> {
    if let Some(path) = &args.coord_token_file {
        if let Some(w) = proto::token_file_warning(path) {
            log(&w);
        }
        let text = std::fs::read_to_string(path).with_context(|| {
            format!("cannot read the coordinator token file {}", path.display())
        })?;
        let t = text.trim();
        if t.is_empty() {
            bail!(
                "the coordinator token file {} is empty: put this agent's token (its `agent` line in the coordinator's token file) in it",
                path.display()
            );
        }
        return Ok(t.to_string());
    }
    let token = std::env::var("MUTIRAO_COORD_TOKEN").map_err(|_| {
        anyhow::anyhow!(
            "--coordinator needs this agent's coordinator token: --coord-token-file FILE (or $MUTIRAO_COORD_TOKEN), the token of an `agent` line of the coordinator's token file"
        )
    })?;
    // Read once, at start, before any other thread runs: nothing started later can see it.
    std::env::remove_var("MUTIRAO_COORD_TOKEN");
    Ok(token)
}

/// `KEY=VALUE` of `--prop`: a key of letters, digits, `_ - .` (what requirements can name).
fn parse_prop(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE, e.g. arch=x86_64"))?;
    let k = k.trim();
    if k.is_empty()
        || !k
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
    {
        return Err(format!(
            "{k:?}: a property key is letters, digits, _ - . (requirements name it)"
        ));
    }
    if ["cpu", "mem", "load", "name"].contains(&k) {
        return Err(format!(
            "{k:?} is measured or set by the agent itself; choose another key"
        ));
    }
    Ok((k.to_string(), v.trim().to_string()))
}

/// The properties a resource hierarchy (mεμ spec) gives host `name`: those of its domain
/// (qualities as `true`, values and amounts as written) and `site`, the name of its nearest
/// ancestor with the quality `site`. Keys the agent measures itself are left out.
fn meu_props(
    path: &std::path::Path,
    name: &str,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    use mutirao_dir::meu::{spec, Hierarchy};
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the resource hierarchy {}", path.display()))?;
    let s = spec::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let (h, _) =
        Hierarchy::from_spec(&s).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let g = h.find_by_name(name).with_context(|| {
        format!(
            "{} has no domain named {name:?} (this host's --name); name the agent as the hierarchy does",
            path.display()
        )
    })?;
    let valid = |k: &str| parse_prop(&format!("{k}=x")).is_ok();
    let mut out = std::collections::BTreeMap::new();
    let set = h.properties(g);
    for (k, v) in &set.exact {
        if valid(k) {
            out.insert(k.clone(), v.clone().unwrap_or_else(|| "true".into()));
        }
    }
    for (k, (_, v)) in &set.acc {
        if valid(k) {
            out.insert(k.clone(), v.to_string());
        }
    }
    let mut up = h.get(g).and_then(|e| e.ancestor);
    while let Some(a) = up {
        let Some(e) = h.get(a) else { break };
        if h.properties(a).has("site", None) {
            out.insert("site".into(), e.name.clone());
            break;
        }
        up = e.ancestor;
    }
    Ok(out)
}

/// Largest program an agent fetches from the coordinator (the coordinator's own default cap).
const MAX_PROGRAM: u64 = 256 << 20;

/// The --program-cache directory (default $TMPDIR/mutirao-agent-programs-IP-PORT).
fn program_cache_dir(args: &AgentArgs, bound: SocketAddr) -> PathBuf {
    args.program_cache.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "mutirao-agent-programs-{}-{}",
            bound.ip(),
            bound.port()
        ))
    })
}

/// The --state-dir directory (default: the program cache's), created mode 0700 (or refused
/// if it exists and is not this agent's alone).
fn state_dir(args: &AgentArgs, bound: SocketAddr) -> anyhow::Result<PathBuf> {
    let dir = args
        .state_dir
        .clone()
        .unwrap_or_else(|| program_cache_dir(args, bound));
    private_dir(&dir, 0o700, "the agent's state", "--state-dir")?;
    Ok(dir)
}

/// Programs by digest from the coordinator's repository, cached in --program-cache; every
/// fetch and refusal goes to the agent's log.
fn program_source(
    args: &AgentArgs,
    bound: SocketAddr,
    client: mutirao_coord::client::Client,
) -> anyhow::Result<agent::ProgramSource> {
    use mutirao_coord::fetch::{Fetched, ProgramCache};
    let dir = program_cache_dir(args, bound);
    private_dir(&dir, 0o700, "cached programs", "--program-cache")?;
    let cache = ProgramCache::open(&dir, client, MAX_PROGRAM)?;
    log(&format!(
        "caching programs from the coordinator in {}",
        dir.display()
    ));
    Ok(agent::ProgramSource {
        resolve: Arc::new(move |digest: &str| match cache.resolve(digest) {
            Ok((path, Fetched::Cached { took })) => {
                log(&format!(
                    "checked the cached {digest} in {:.1} ms",
                    took.as_secs_f64() * 1e3
                ));
                Ok(path)
            }
            Ok((path, Fetched::Downloaded { bytes, took })) => {
                log(&format!(
                    "fetched {digest} ({bytes} bytes) from the coordinator's repository in {:.1} ms",
                    took.as_secs_f64() * 1e3
                ));
                Ok(path)
            }
            Err(e) => {
                log(&format!("refused to run {digest}: {e}"));
                Err(e.to_string())
            }
        }),
    })
}

pub fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.gen_token {
        let t = mutirao::pmi::hex(&mutirao::pmi::new_token()?);
        write_atomic_mode(path, format!("{t}\n"), 0o600)?;
        println!("wrote a new agent token to {}", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let token_path = args
        .token_file
        .clone()
        .unwrap_or_else(proto::default_token_path);
    let secret = Arc::new(proto::read_token_file(&token_path).map_err(anyhow::Error::msg)?);
    if let Some(w) = proto::token_file_warning(&token_path) {
        log(&w);
    }
    // Before anything else runs: the token leaves the environment before any thread starts.
    let coord_token = match &args.coordinator {
        Some(_) => Some(coord_token(&args)?),
        None => None,
    };
    let run_as = RunAs::choose(args.run_as.as_deref(), args.job_uids)?;
    let addr: SocketAddr = args
        .listen
        .parse()
        .with_context(|| format!("--listen {:?} is not IP:PORT", args.listen))?;
    let listener = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    let dir_socket: Option<Arc<PathBuf>> = if args.no_dir {
        None
    } else {
        Some(Arc::new(start_directory(&args, bound, &secret)?))
    };
    // Printed once everything this agent serves is ready.
    if args.print_addr {
        println!("{bound}");
        let _ = std::io::stdout().flush();
    }
    let store = if args.no_store {
        None
    } else {
        let dir = args.store_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!(
                "mutirao-agent-store-{}-{}",
                bound.ip(),
                bound.port()
            ))
        });
        private_dir(&dir, 0o700, "checkpoint replicas", "--store-dir")?;
        let s = mutirao_ckpt::DirStore::open(&dir)
            .map_err(|e| anyhow::anyhow!("checkpoint store {}: {e}", dir.display()))?;
        log(&format!("keeping checkpoint replicas in {}", dir.display()));
        Some(Arc::new(s))
    };
    let procs = agent::Procs::default();
    // Set when the owner's decision changes: the next heartbeat goes at once.
    let nudge = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The owner's policy, evaluated every second; kept alive while the agent serves.
    let owner = match &args.owner_policy {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the owner policy {}", path.display()))?;
            let policy = mutirao_coord::policy::Policy::parse(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            if policy.input_idle_s.is_some() && !mutirao_coord::owner::input_measurable() {
                log("owner policy: keyboard and mouse use cannot be measured on this host (no i8042, keyboard or mouse line in /proc/interrupts); input_idle_s is not applied");
            }
            let (p2, n2) = (procs.clone(), nudge.clone());
            let coordinated = args.coordinator.is_some();
            let (sampler, source) = mutirao_coord::owner::host_sampler();
            log(&format!(
                "owner policy: the owner's load is this host's CPU time from {source}, minus the agent's and its processes'"
            ));
            let w = mutirao_coord::owner::spawn_owner_watch(
                policy,
                Duration::from_secs(1),
                sampler,
                Box::new(move |from, to, why| {
                    use mutirao_coord::policy::OwnerState;
                    n2.store(true, std::sync::atomic::Ordering::SeqCst);
                    match to {
                        OwnerState::Suspend => {
                            let n = p2.stop_all();
                            log(&format!("owner active ({why}): stopped {n} grid process group(s)"));
                        }
                        OwnerState::Available => {
                            let n = p2.continue_all();
                            log(&format!("owner away ({from} before): continued {n} grid process group(s)"));
                        }
                        OwnerState::Vacate if coordinated => log(&format!(
                            "owner still active after the grace period ({why}): the coordinator moves the grid's work elsewhere"
                        )),
                        OwnerState::Vacate => {
                            // No coordinator to move the work: end it here; a launcher with
                            // checkpoints restarts it without this host.
                            let n = p2.kill_all();
                            log(&format!(
                                "owner still active after the grace period ({why}): killed {n} grid process group(s)"
                            ));
                        }
                    }
                }),
            );
            log(&format!(
                "owner policy {}: {}",
                path.display(),
                w.status().state
            ));
            Some(w)
        }
    };
    let owner_status = owner.as_ref().map(|w| w.shared());
    let mut programs = None;
    let mut journal = None;
    // Kept alive while the agent serves: dropping it stops the heartbeats.
    let _heartbeat = match &args.coordinator {
        None => None,
        Some(url) => {
            let token = coord_token.clone().unwrap_or_default();
            let client = mutirao_coord::client::Client::new(url, &token)
                .map_err(|e| anyhow::anyhow!("--coordinator {url}: {e}"))?;
            programs = Some(program_source(
                &args,
                bound,
                mutirao_coord::client::Client::new(url, &token)
                    .map_err(|e| anyhow::anyhow!("--coordinator {url}: {e}"))?,
            )?);
            let state = state_dir(&args, bound)?;
            let (j, orphaned) =
                mutirao_launch::journal::RankJournal::open(&state.join("ranks.json"))?;
            log(&format!(
                "journalling grid ranks in {}{}",
                state.join("ranks.json").display(),
                if orphaned > 0 {
                    format!(
                        " ({orphaned} rank(s) a previous agent left alive recorded as ended, status unknown)"
                    )
                } else {
                    String::new()
                }
            ));
            let j = Arc::new(j);
            journal = Some(j.clone());
            let usage_path = state.join("usage.json");
            let usage = mutirao_coord::usage::AgentUsage::open(&usage_path)?;
            log(&format!(
                "keeping this host's usage history in {}",
                usage_path.display()
            ));
            let name = args.name.clone().unwrap_or_else(agent::host_name);
            let addr = bound.to_string();
            let mut props = match &args.resources {
                Some(path) => {
                    let p = meu_props(path, &name)?;
                    log(&format!(
                        "properties of {name} from the resource hierarchy {}: {}",
                        path.display(),
                        p.iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                    p
                }
                None => std::collections::BTreeMap::new(),
            };
            props.extend(args.props.iter().cloned());
            if let Some(site) = &args.site {
                props.insert("site".into(), site.clone());
            }
            let hb = mutirao_coord::report::spawn_heartbeat_retrying(
                client,
                Box::new(move || {
                    let owner = owner_status
                        .as_ref()
                        .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).clone())
                        .unwrap_or_default();
                    let mut r = mutirao_coord::report::measure_with(&name, &addr, &owner, &props)?;
                    r.jobs = j.report();
                    // One sample of the usage history per report: idle when the owner's
                    // policy leaves the host to the grid.
                    let (u, err) = usage.sample(!r.owner_busy());
                    if let Some(e) = err {
                        log(&e.to_string());
                    }
                    r.usage = Some(u);
                    Ok(r)
                }),
                nudge,
                Box::new(log),
            )
            .map_err(|e| anyhow::anyhow!("cannot measure this host for the coordinator: {e}"))?;
            Some(hb)
        }
    };
    let jobs_dir = args.jobs_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "mutirao-agent-jobs-{}-{}",
            bound.ip(),
            bound.port()
        ))
    });
    let sandbox = Arc::new(Sandbox::new(run_as, &jobs_dir)?);
    log(&sandbox.run_as().describe());
    log(&format!("listening on {bound}"));
    agent::serve_forever(
        listener,
        AgentConfig {
            secret,
            dir_socket: dir_socket.map(|p| p.as_ref().clone()),
            log: Arc::new(log),
            store,
            procs,
            programs,
            journal,
            sandbox,
            limits: agent::Limits::default(),
        },
    );
    drop(owner);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_takes_its_domain_s_properties_and_site_from_the_hierarchy() {
        let dir = std::env::temp_dir().join(format!("mutirao-agent-meu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("g1.meu");
        std::fs::write(
            &p,
            r#"tb: "g1" { testbed, "wan.a.b"=40 };
s0: "a" <tb> { site };
s1: "b" <tb> { site };
h0: "a1" <s0> { host, addr="10.213.0.2", cpu="1", cpu_milli=1000, nic_mbit=800 };
h1: "b1" <s1> { host, addr="10.213.1.2", cpu="0.5", cpu_milli=500, nic_mbit=200 };
"#,
        )
        .unwrap();
        let b1 = meu_props(&p, "b1").unwrap();
        assert_eq!(b1.get("site").map(String::as_str), Some("b"), "{b1:?}");
        assert_eq!(
            b1.get("cpu_milli").map(String::as_str),
            Some("500"),
            "{b1:?}"
        );
        assert_eq!(
            b1.get("nic_mbit").map(String::as_str),
            Some("200"),
            "{b1:?}"
        );
        assert_eq!(
            b1.get("addr").map(String::as_str),
            Some("10.213.1.2"),
            "{b1:?}"
        );
        assert_eq!(b1.get("host").map(String::as_str), Some("true"), "{b1:?}");
        // The agent measures cpu itself: the hierarchy's quota is not reported as `cpu`.
        assert!(!b1.contains_key("cpu"), "{b1:?}");
        let e = meu_props(&p, "c9").unwrap_err().to_string();
        assert!(e.contains("no domain named \"c9\""), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
