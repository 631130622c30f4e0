//! Hostfiles: which hosts a job runs on and how many ranks each takes.
//!
//! Accepted line forms (one host per line, `#` starts a comment):
//! - Open MPI: `HOST [slots=N] [port=P]`
//! - Hydra (MPICH): `HOST:N`
//!
//! `port` is the port of the host's `mutirao agent` (default [`DEFAULT_AGENT_PORT`]).

/// Port `mutirao agent` listens on unless told otherwise.
pub const DEFAULT_AGENT_PORT: u16 = 7207;

/// One hostfile entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    pub host: String,
    pub slots: usize,
    pub port: u16,
}

/// The name of hostfile entry `i` among `hosts`, as the launcher, its reports and the journal
/// call that host: its host, or `host:port` when several agents share a host name (agents on
/// one machine, or containers behind one address): a host is an agent, not an address.
pub fn agent_name(hosts: &[HostEntry], i: usize) -> String {
    let h = &hosts[i];
    let shared = hosts.iter().any(|o| o.host == h.host && o.port != h.port);
    if shared {
        format!("{}:{}", h.host, h.port)
    } else {
        h.host.clone()
    }
}

/// Parse a hostfile; errors name the line.
pub fn parse(text: &str) -> Result<Vec<HostEntry>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = |msg: String| format!("hostfile line {}: {msg}: {raw:?}", i + 1);
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        let (host, mut slots) = match first.rsplit_once(':') {
            // host:N (but not a bare IPv6 address)
            Some((h, n)) if !h.contains(':') && !h.is_empty() => (
                h.to_string(),
                Some(
                    n.parse::<usize>()
                        .map_err(|_| at(format!("{n:?} is not a slot count")))?,
                ),
            ),
            _ => (first.to_string(), None),
        };
        let mut port = DEFAULT_AGENT_PORT;
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| at(format!("expected key=value, found {w:?}")))?;
            match k {
                "slots" | "max_slots" if k == "slots" => {
                    slots = Some(
                        v.parse()
                            .map_err(|_| at(format!("slots={v:?} is not a number")))?,
                    )
                }
                "max_slots" => {}
                "port" => {
                    port = v
                        .parse()
                        .map_err(|_| at(format!("port={v:?} is not a port number")))?
                }
                other => return Err(at(format!("unknown key {other:?} (known: slots, port)"))),
            }
        }
        let slots = slots.unwrap_or(1);
        if slots == 0 {
            return Err(at("a host needs at least one slot".into()));
        }
        out.push(HostEntry { host, slots, port });
    }
    if out.is_empty() {
        return Err("the hostfile lists no host".into());
    }
    Ok(out)
}

/// Place `n` ranks on the hosts by filling slots in order (like `mpirun --map-by slot`); when
/// every slot is taken, wrap around (oversubscribe) rather than refuse.
pub fn place(hosts: &[HostEntry], n: usize) -> Vec<usize> {
    let total: usize = hosts.iter().map(|h| h.slots).sum();
    let mut out = Vec::with_capacity(n);
    for r in 0..n {
        let mut k = r % total.max(1);
        for (i, h) in hosts.iter().enumerate() {
            if k < h.slots {
                out.push(i);
                break;
            }
            k -= h.slots;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_and_comments() {
        let h = parse(
            "# cluster\nnode1 slots=2\nnode2:4   # hydra form\n10.0.0.3 slots=1 port=9000\n\nnode4\n",
        )
        .unwrap();
        assert_eq!(
            h,
            vec![
                HostEntry {
                    host: "node1".into(),
                    slots: 2,
                    port: DEFAULT_AGENT_PORT
                },
                HostEntry {
                    host: "node2".into(),
                    slots: 4,
                    port: DEFAULT_AGENT_PORT
                },
                HostEntry {
                    host: "10.0.0.3".into(),
                    slots: 1,
                    port: 9000
                },
                HostEntry {
                    host: "node4".into(),
                    slots: 1,
                    port: DEFAULT_AGENT_PORT
                },
            ]
        );
    }

    #[test]
    fn bad_lines_name_the_line() {
        let e = parse("a slots=2\nb slots=x\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let e = parse("a colour=red").unwrap_err();
        assert!(e.contains("unknown key"), "{e}");
        assert!(parse("# nothing\n").is_err());
        assert!(parse("a slots=0").is_err());
    }

    #[test]
    fn placement_fills_slots_then_wraps() {
        let h = parse("a slots=2\nb slots=1").unwrap();
        assert_eq!(place(&h, 5), vec![0, 0, 1, 0, 0]);
    }
}
