//! `mutirao dir …` (the directory service) and `mutirao resources …` (mεμ spec files):
//! thin shells over `mutirao-dir`.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use mutirao_dir::client::Client;
use mutirao_dir::meu::props::{PropSet, Property};
use mutirao_dir::meu::{spec, EntityType, Hierarchy};
use mutirao_dir::server::{run_blocking, ServerConfig};
use mutirao_dir::{Acl, Attr, AttrList, AttrValue, DirConfig, Gid, GidSplit, Scope};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct SocketArg {
    /// The directory server's Unix socket.
    #[arg(long, default_value = "/tmp/mutirao-dir.sock")]
    socket: PathBuf,
}

#[derive(Subcommand)]
pub enum DirCommand {
    /// Run a directory server (until killed); the agent embeds the same server.
    Serve {
        #[command(flatten)]
        s: SocketArg,
        /// TCP address for peer servers (default 127.0.0.1:7700). Needs a cluster key: without
        /// one the server listens on its Unix socket only.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// A peer server's TCP address (repeatable).
        #[arg(long = "peer")]
        peers: Vec<SocketAddr>,
        /// File holding the shared cluster key (or set MUTIRAO_CLUSTER_KEY).
        #[arg(long)]
        key_file: Option<PathBuf>,
        /// This server's cluster (site) id.
        #[arg(long, default_value_t = 0)]
        cluster: u64,
        /// This server's node serial number (unique per server in a site).
        #[arg(long, default_value_t = 1)]
        node: u64,
        /// Gid split as CLUSTER_BITS/NODE_BITS (the counter gets the rest).
        #[arg(long, default_value = "16/16")]
        split: String,
        /// Heartbeat timeout in milliseconds.
        #[arg(long, default_value_t = 3000)]
        heartbeat_ms: u64,
        /// Fan-out timeout in milliseconds (silence = not found).
        #[arg(long, default_value_t = 200)]
        peer_timeout_ms: u64,
    },
    /// Register a resource (bound to the server, so it stays until `rm`).
    Register {
        #[command(flatten)]
        s: SocketArg,
        /// Return the existing gid if an equal resource exists.
        #[arg(long)]
        unique: bool,
        /// Restrict visibility to the owner plus these uids (repeatable).
        #[arg(long = "allow-user")]
        users: Vec<u32>,
        /// … and these gids (repeatable).
        #[arg(long = "allow-group")]
        groups: Vec<u32>,
        /// Attributes NAME=VALUE.
        #[arg(required = true)]
        attrs: Vec<String>,
    },
    /// Find one resource: by --gid and/or attributes NAME=VALUE; `NAME?` asks for a value.
    Query {
        #[command(flatten)]
        s: SocketArg,
        /// local, site or grid.
        #[arg(long, default_value = "grid")]
        scope: Scope,
        /// The resource's gid (0x… or decimal).
        #[arg(long)]
        gid: Option<String>,
        /// NAME=VALUE to match, NAME? to fetch.
        attrs: Vec<String>,
    },
    /// List every visible resource matching NAME=VALUE… (all when none given).
    Ls {
        #[command(flatten)]
        s: SocketArg,
        /// local, site or grid.
        #[arg(long, default_value = "local")]
        scope: Scope,
        /// NAME=VALUE filters.
        attrs: Vec<String>,
    },
    /// Delete a resource you own.
    Rm {
        #[command(flatten)]
        s: SocketArg,
        /// Its gid (0x… or decimal).
        gid: String,
    },
}

#[derive(Subcommand)]
pub enum ResourcesCommand {
    /// Parse a physical resource specification and check its labels.
    Check {
        /// The spec file (Fig. 4.3 grammar).
        spec: PathBuf,
    },
    /// Print the hierarchy with each domain's accumulated properties P(x).
    Show {
        /// The spec file.
        spec: PathBuf,
    },
    /// meu_lookup: the first domain under --from whose properties satisfy PROP[=VALUE]…
    Lookup {
        /// The spec file.
        spec: PathBuf,
        /// Start at this label or domain name (default: the first root).
        #[arg(long)]
        from: Option<String>,
        /// Only a domain with this name.
        #[arg(long)]
        name: Option<String>,
        /// Required properties: `Myrinet`, `CPU=2`, `GFS=/ethfs`.
        props: Vec<String>,
    },
    /// meu-phyparse: register every domain of a spec in a directory server, ancestors first,
    /// so that programs find them there (`mutirao dir query --scope grid tipo=domínio
    /// nome=a1`). Each record holds `tipo`, `nome`, `ascend` (the ancestor's gid), `originals`
    /// and the domain's own properties. If one registration fails, those already made are
    /// deleted again.
    ///
    /// Example: mutirao resources register /run/mutirao-testbed/g1.meu --socket /tmp/d.sock
    #[command(verbatim_doc_comment)]
    Register {
        /// The spec file.
        spec: PathBuf,
        #[command(flatten)]
        s: SocketArg,
    },
}

/// Registers every domain of `sp` through `c`, ancestors first; returns the label → gid map.
/// On a failure, deletes what it registered and returns the error.
fn register_domains(
    c: &mut Client,
    sp: &spec::Spec,
) -> anyhow::Result<std::collections::HashMap<String, Gid>> {
    let mut made: Vec<Gid> = vec![];
    let mut failure: Option<String> = None;
    let res = Hierarchy::default().add_spec(sp, |_, e| {
        let attrs = Hierarchy::entity_attrs(e).map_err(|x| x.to_string())?;
        match c.register(Gid::NONE, &attrs, &Acl::Public, false) {
            Ok(r) => {
                made.push(r.gid);
                Ok(r.gid)
            }
            Err(x) => {
                failure = Some(format!("cannot register domain {:?}: {x}", e.name));
                Err(x.to_string())
            }
        }
    });
    match res {
        Ok(labels) => Ok(labels),
        Err(e) => {
            for g in made.iter().rev() {
                let _ = c.delete(*g);
            }
            bail!(
                "{}; nothing is left registered",
                failure.unwrap_or_else(|| e.to_string())
            )
        }
    }
}

fn parse_gid(s: &str) -> anyhow::Result<Gid> {
    let v = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .with_context(|| format!("{s:?} is not a gid (give 0x… hex or a decimal number)"))?;
    Ok(Gid(v))
}

fn parse_attrs(items: &[String], allow_want: bool) -> anyhow::Result<AttrList> {
    let mut l = AttrList::new();
    for it in items {
        let a = if let Some((n, v)) = it.split_once('=') {
            Attr::full(n, v)
        } else if let Some(n) = it.strip_suffix('?').filter(|_| allow_want) {
            Attr::want(n, mutirao_dir::attr::MAX_VALUE_LEN as u32)
        } else {
            bail!(
                "attribute {it:?}: write NAME=VALUE{}",
                if allow_want { " or NAME?" } else { "" }
            );
        };
        l.insert(a).with_context(|| format!("attribute {it:?}"))?;
    }
    Ok(l)
}

/// Where `dir serve` listens for peer servers: `--listen` (default 127.0.0.1:7700) with a
/// cluster key; nowhere without one (anyone could pass the handshake of an empty key and act
/// as any uid), and `--listen` without a key is an error.
fn peer_listener(listen: Option<SocketAddr>, key: &[u8]) -> anyhow::Result<Option<SocketAddr>> {
    match (listen, key.is_empty()) {
        (Some(a), true) => bail!(
            "--listen {a} needs a cluster key: give --key-file FILE or set MUTIRAO_CLUSTER_KEY \
             (without a key the server serves its Unix socket only)"
        ),
        (None, true) => Ok(None),
        (a, false) => {
            Ok(Some(a.unwrap_or_else(|| {
                SocketAddr::from(([127, 0, 0, 1], 7700))
            })))
        }
    }
}

fn show_attrs(a: &AttrList) -> String {
    a.iter()
        .map(|x| match &x.value {
            AttrValue::Full(v) => match std::str::from_utf8(v) {
                Ok(s) if !s.chars().any(char::is_control) => format!("{}={s}", x.name),
                _ => format!(
                    "{}=0x{}",
                    x.name,
                    v.iter().map(|b| format!("{b:02x}")).collect::<String>()
                ),
            },
            AttrValue::Want { .. } => format!("{}=?", x.name),
        })
        .collect::<Vec<_>>()
        .join("\t")
}

pub fn run_dir(cmd: DirCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        DirCommand::Serve {
            s,
            listen,
            peers,
            key_file,
            cluster,
            node,
            split,
            heartbeat_ms,
            peer_timeout_ms,
        } => {
            let (cb, nb) = split
                .split_once('/')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .with_context(|| {
                    format!("--split {split:?}: write CLUSTER_BITS/NODE_BITS, e.g. 16/16")
                })?;
            let key = match key_file {
                Some(f) => std::fs::read(&f)
                    .with_context(|| format!("cannot read key file {}", f.display()))?,
                None => std::env::var("MUTIRAO_CLUSTER_KEY")
                    .unwrap_or_default()
                    .into_bytes(),
            };
            if !peers.is_empty() && key.is_empty() {
                bail!("--peer needs a cluster key: --key-file FILE or MUTIRAO_CLUSTER_KEY");
            }
            let listen = peer_listener(listen, &key)?;
            let cfg = ServerConfig {
                dir: DirConfig {
                    split: GidSplit::new(cb, nb)?,
                    cluster,
                    node,
                    heartbeat_timeout: Duration::from_millis(heartbeat_ms),
                    ..DirConfig::default()
                },
                peers,
                cluster_key: key,
                peer_timeout: Duration::from_millis(peer_timeout_ms),
                ..ServerConfig::default()
            };
            let sock = s.socket.clone();
            run_blocking(cfg, Some(s.socket), listen, |bound| {
                eprintln!(
                    "mutirao dir: serving {} (peers on {})",
                    sock.display(),
                    bound.map_or("-".into(), |b| b.to_string())
                );
            })?;
            Ok(ExitCode::SUCCESS)
        }
        DirCommand::Register {
            s,
            unique,
            users,
            groups,
            attrs,
        } => {
            let attrs = parse_attrs(&attrs, false)?;
            let acl = if users.is_empty() && groups.is_empty() {
                Acl::Public
            } else {
                Acl::Only { users, groups }
            };
            let mut c = Client::connect(&s.socket)?;
            let r = c.register(Gid::NONE, &attrs, &acl, unique)?;
            println!("{}{}", r.gid, if r.created { "" } else { "\t(existing)" });
            Ok(ExitCode::SUCCESS)
        }
        DirCommand::Query {
            s,
            scope,
            gid,
            attrs,
        } => {
            let gid = gid.as_deref().map(parse_gid).transpose()?;
            let q = parse_attrs(&attrs, true)?;
            if gid.is_none() && q.is_empty() {
                bail!("give --gid or at least one attribute (use `ls` to list everything)");
            }
            let mut c = Client::connect(&s.socket)?;
            match c.query(gid, &q, scope) {
                Ok((g, a)) => {
                    println!("{g}\t{}", show_attrs(&a));
                    Ok(ExitCode::SUCCESS)
                }
                Err(mutirao_dir::DirError::NoMatch) | Err(mutirao_dir::DirError::NotFound(_)) => {
                    eprintln!("not found");
                    Ok(ExitCode::from(1))
                }
                Err(e) => Err(e.into()),
            }
        }
        DirCommand::Ls { s, scope, attrs } => {
            let q = parse_attrs(&attrs, false)?;
            let mut c = Client::connect(&s.socket)?;
            for r in c.query_iter(&q, scope)? {
                let (g, a) = r?;
                println!("{g}\t{}", show_attrs(&a));
            }
            Ok(ExitCode::SUCCESS)
        }
        DirCommand::Rm { s, gid } => {
            let g = parse_gid(&gid)?;
            Client::connect(&s.socket)?.delete(g)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn load(
    path: &PathBuf,
) -> anyhow::Result<(
    spec::Spec,
    Hierarchy,
    std::collections::HashMap<String, Gid>,
)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read spec file {}", path.display()))?;
    let s = spec::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let (h, labels) =
        Hierarchy::from_spec(&s).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok((s, h, labels))
}

fn show_tree(h: &Hierarchy, g: Gid, depth: usize) {
    if let Some(e) = h.get(g) {
        let alias = if e.is_alias() {
            let names: Vec<&str> = e
                .originals
                .iter()
                .filter_map(|o| h.get(*o).map(|x| x.name.as_str()))
                .collect();
            format!(" = alias of ({})", names.join(", "))
        } else {
            String::new()
        };
        println!(
            "{}{}{} {}",
            "  ".repeat(depth),
            e.name,
            alias,
            h.properties(g)
        );
        for d in h.descendants(g) {
            show_tree(h, *d, depth + 1);
        }
    }
}

pub fn run_resources(cmd: ResourcesCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ResourcesCommand::Check { spec: path } => {
            let (s, h, _) = load(&path)?;
            let nodes = h
                .roots()
                .iter()
                .flat_map(|r| std::iter::once(*r).chain(all_under(&h, *r)))
                .filter(|g| h.get(*g).is_some_and(|e| e.node))
                .count();
            println!(
                "{}: ok, {} domains ({} nodes, {} aliases)",
                path.display(),
                s.domains.len(),
                nodes,
                s.domains.iter().filter(|d| !d.originals.is_empty()).count()
            );
            Ok(ExitCode::SUCCESS)
        }
        ResourcesCommand::Register { spec: path, s } => {
            let (sp, _, _) = load(&path)?;
            let mut c = Client::connect(&s.socket)?;
            let labels = register_domains(&mut c, &sp)
                .with_context(|| format!("registering {}", path.display()))?;
            let mut by_gid: Vec<(&String, &Gid)> = labels.iter().collect();
            by_gid.sort_by_key(|(_, g)| g.0);
            for (label, gid) in by_gid {
                println!("{gid}	{label}");
            }
            eprintln!(
                "registered {} domains of {} on {}",
                sp.domains.len(),
                path.display(),
                s.socket.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        ResourcesCommand::Show { spec: path } => {
            let (_, h, _) = load(&path)?;
            for r in h.roots() {
                show_tree(&h, *r, 0);
            }
            Ok(ExitCode::SUCCESS)
        }
        ResourcesCommand::Lookup {
            spec: path,
            from,
            name,
            props,
        } => {
            let (_, h, labels) = load(&path)?;
            let start = match from {
                Some(f) => labels
                    .get(&f)
                    .copied()
                    .or_else(|| h.find_by_name(&f))
                    .with_context(|| format!("--from {f:?}: no such label or domain"))?,
                None => *h.roots().first().context("the spec has no root domain")?,
            };
            let mut want = vec![];
            for p in &props {
                want.push(match p.split_once('=') {
                    Some((n, v)) => match v.parse::<i64>() {
                        Ok(x) => Property::sum(n, x),
                        Err(_) => Property::exact(n, v),
                    },
                    None => Property::flag(p.as_str()),
                });
            }
            let q = PropSet::of(want);
            match h.lookup(start, name.as_deref(), Some(EntityType::Domain), &q) {
                Some(g) => {
                    let e = h.get(g).context("lookup returned an unknown entity")?;
                    println!("{}\t{}", e.name, h.properties(g));
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!("no domain under the start satisfies {q}");
                    Ok(ExitCode::from(1))
                }
            }
        }
    }
}

fn all_under(h: &Hierarchy, g: Gid) -> Vec<Gid> {
    let mut out = vec![];
    for d in h.descendants(g) {
        out.push(*d);
        out.extend(all_under(h, *d));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory server on a temporary socket, served until the test process ends.
    fn server(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mutirao-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("d.sock");
        let (tx, rx) = std::sync::mpsc::channel();
        let path = sock.clone();
        std::thread::spawn(move || {
            let r = run_blocking(ServerConfig::default(), Some(path), None, |_| {
                let _ = tx.send(());
            });
            eprintln!("test directory server ended: {r:?}");
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("server ready");
        sock
    }

    fn count(c: &mut Client) -> usize {
        c.query_iter(&AttrList::new(), Scope::Local)
            .unwrap()
            .count()
    }

    #[test]
    fn dir_serve_without_a_key_listens_on_its_unix_socket_only() {
        let a: SocketAddr = "127.0.0.1:7800".parse().unwrap();
        let e = peer_listener(Some(a), b"").unwrap_err().to_string();
        assert!(e.contains("--key-file"), "{e}");
        assert_eq!(peer_listener(None, b"").unwrap(), None);
        assert_eq!(peer_listener(Some(a), b"k").unwrap(), Some(a));
        assert_eq!(
            peer_listener(None, b"k").unwrap(),
            Some("127.0.0.1:7700".parse().unwrap())
        );
    }

    #[test]
    fn register_puts_every_domain_in_the_directory_ancestors_first() {
        let sock = server("res-reg");
        let text = r#"g: "g1" { testbed };
            a: "a" <g> { site };
            h: "a1" <a> { host, cpu_milli=1000 };"#;
        let sp = spec::parse(text).unwrap();
        let mut c = Client::connect(&sock).unwrap();
        let labels = register_domains(&mut c, &sp).unwrap();
        assert_eq!(labels.len(), 3);
        let q = AttrList::from_pairs([("tipo", "domínio"), ("nome", "a1")]).unwrap();
        let (gid, attrs) = c.query(None, &q, Scope::Local).unwrap();
        assert_eq!(gid, labels["h"]);
        let ascend = attrs.get("ascend").expect("ascend attribute");
        assert_eq!(
            ascend.value,
            AttrValue::Full(labels["a"].0.to_le_bytes().to_vec())
        );
        // A spec whose third domain cannot be registered leaves nothing behind.
        let before = count(&mut c);
        let huge = "x".repeat(70 * 1024);
        let bad = format!(
            r#"g: "g2" {{ testbed }}; a: "b" <g> {{ site }}; h: "b1" <a> {{ blob="{huge}" }};"#
        );
        let e = register_domains(&mut c, &spec::parse(&bad).unwrap()).unwrap_err();
        assert!(
            format!("{e:#}").contains("nothing is left registered"),
            "{e:#}"
        );
        assert_eq!(count(&mut c), before);
        let _ = std::fs::remove_dir_all(sock.parent().unwrap());
    }
}
