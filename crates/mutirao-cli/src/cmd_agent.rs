//! `mutirao agent`: one per host. Starts, watches and ends the processes an authenticated launcher
//! asks for, streams their output back and reports how they ended.

use crate::agent_proto::{self as proto, Msg, Stream};
use crate::fsutil::write_atomic_mode;
use anyhow::{bail, Context};
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Run the per-host agent that `mutirao run --hostfile` talks to.
///
/// The agent runs programs only for launchers that prove they hold the shared token (HMAC
/// challenge–response; the token never crosses the network). It listens on loopback unless told
/// otherwise.
///
/// Examples:
///   mutirao agent --gen-token ~/.mutirao/agent.token     # once, then copy the file to every host
///   mutirao agent --listen 127.0.0.1:7207
///   mutirao agent --listen 10.1.0.5:7207 --token-file /etc/mutirao/agent.token
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
    log(&format!("listening on {bound}"));
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                log(&format!("accept failed: {e}"));
                continue;
            }
        };
        let secret = secret.clone();
        let dir_socket = dir_socket.clone();
        let _ = std::thread::Builder::new()
            .name("agent-conn".into())
            .spawn(move || {
                let peer = conn
                    .peer_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|_| "?".into());
                if let Err(e) = serve(conn, &secret, dir_socket.as_deref()) {
                    log(&format!("session with {peer}: {e:#}"));
                }
            });
    }
    Ok(ExitCode::SUCCESS)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn serve(conn: TcpStream, secret: &[u8], dir_socket: Option<&PathBuf>) -> anyhow::Result<()> {
    let peer = conn.peer_addr()?;
    conn.set_nodelay(true).ok();
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut r = BufReader::new(conn.try_clone()?);
    let w = Arc::new(Mutex::new(conn.try_clone()?));
    let send = |m: &Msg| -> anyhow::Result<()> {
        let mut g = w.lock().map_err(|_| anyhow::anyhow!("writer poisoned"))?;
        proto::write_msg(&mut *g, m)?;
        Ok(())
    };
    // Authentication.
    let nonce = proto::nonce()?;
    send(&Msg::Challenge {
        version: proto::AGENT_PROTOCOL,
        nonce: nonce.clone(),
    })?;
    let client_nonce = match proto::read_msg(&mut r) {
        Ok(Some(Msg::Auth { mac, nonce: cn }))
            if proto::verify(secret, proto::CLIENT_LABEL, &nonce, &mac) =>
        {
            cn
        }
        Ok(Some(Msg::Auth { .. })) => {
            let _ = send(&Msg::Error {
                msg: "authentication failed".into(),
            });
            bail!("refused {peer}: wrong token");
        }
        Ok(other) => {
            let _ = send(&Msg::Error {
                msg: "authenticate first".into(),
            });
            bail!("refused {peer}: expected auth, got {other:?}");
        }
        Err(e) => {
            let _ = send(&Msg::Error {
                msg: "malformed request".into(),
            });
            bail!("refused {peer}: {e}");
        }
    };
    if client_nonce.len() < 32 {
        let _ = send(&Msg::Error {
            msg: "nonce too short".into(),
        });
        bail!("refused {peer}: short nonce");
    }
    send(&Msg::Welcome {
        mac: proto::mac(secret, proto::SERVER_LABEL, &client_nonce),
        host: host_name(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    })?;
    r.get_ref()
        .set_read_timeout(Some(Duration::from_secs(60)))?;
    // The job.
    let (program, args, cwd, ranks) = match proto::read_msg(&mut r) {
        Ok(Some(Msg::Launch {
            program,
            args,
            cwd,
            ranks,
        })) => (program, args, cwd, ranks),
        Ok(None) => return Ok(()),
        Ok(Some(other)) => {
            let _ = send(&Msg::Error {
                msg: "expected a launch request".into(),
            });
            bail!("{peer}: expected launch, got {other:?}");
        }
        Err(e) => {
            let _ = send(&Msg::Error {
                msg: format!("malformed launch request: {e}"),
            });
            bail!("{peer}: malformed launch: {e}");
        }
    };
    if program.is_empty() || ranks.is_empty() {
        let _ = send(&Msg::Error {
            msg: "a launch needs a program and at least one rank".into(),
        });
        bail!("{peer}: empty launch");
    }
    log(&format!(
        "{peer}: starting {program:?} as ranks {:?}",
        ranks.iter().map(|r| r.rank).collect::<Vec<_>>()
    ));
    let mut pids: Vec<i32> = Vec::new();
    let mut waiters = Vec::new();
    for spec in &ranks {
        let mut cmd = Command::new(&program);
        cmd.args(&args).envs(&spec.env);
        if let Some(sock) = dir_socket {
            // This host's directory, whatever the launcher's environment said.
            cmd.env("MUTIRAO_DIR_SOCKET", sock);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(d) = &cwd {
            if Path::new(d).is_dir() {
                cmd.current_dir(d);
            }
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                kill_all(&pids, libc::SIGKILL);
                let _ = send(&Msg::Error {
                    msg: format!("cannot start {program:?} for rank {}: {e}", spec.rank),
                });
                bail!("{peer}: cannot start {program:?}: {e}");
            }
        };
        pids.push(child.id() as i32);
        send(&Msg::Started {
            rank: spec.rank,
            pid: child.id(),
        })?;
        let rank = spec.rank;
        let mut readers = Vec::new();
        for (stream, pipe) in [
            (
                Stream::Out,
                child
                    .stdout
                    .take()
                    .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            ),
            (
                Stream::Err,
                child
                    .stderr
                    .take()
                    .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            ),
        ] {
            let Some(pipe) = pipe else { continue };
            let w = w.clone();
            readers.push(std::thread::spawn(move || {
                let mut br = BufReader::new(pipe);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match br.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            if buf.last() == Some(&b'\n') {
                                buf.pop();
                            }
                            let m = Msg::Output {
                                rank,
                                stream,
                                line: String::from_utf8_lossy(&buf).into_owned(),
                            };
                            if let Ok(mut g) = w.lock() {
                                if proto::write_msg(&mut *g, &m).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                }
            }));
        }
        let w = w.clone();
        waiters.push(std::thread::spawn(move || {
            let st = child.wait();
            for t in readers {
                let _ = t.join();
            }
            let (code, signal) = match st {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            if let Ok(mut g) = w.lock() {
                let _ = proto::write_msg(&mut *g, &Msg::Exit { rank, code, signal });
            }
        }));
    }
    // When every rank has ended, close the session (this also ends the read loop below).
    let closer = conn.try_clone()?;
    std::thread::spawn(move || {
        for t in waiters {
            let _ = t.join();
        }
        let _ = closer.shutdown(Shutdown::Both);
    });
    // Listen for kill requests; a vanished launcher ends everything it started.
    r.get_ref().set_read_timeout(None)?;
    loop {
        match proto::read_msg(&mut r) {
            Ok(Some(Msg::Kill { signal })) => {
                let sig = if signal == libc::SIGKILL {
                    libc::SIGKILL
                } else {
                    libc::SIGTERM
                };
                kill_all(&pids, sig);
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                kill_all(&pids, libc::SIGKILL);
                return Ok(());
            }
        }
    }
}

fn kill_all(pids: &[i32], sig: i32) {
    for pid in pids {
        // SAFETY: kill(2) has no memory-safety preconditions; -pid addresses the process group
        // each child leads (process_group(0)). Signalling an already-reaped group is harmless
        // (ESRCH).
        unsafe {
            libc::kill(-*pid, sig);
        }
    }
}
