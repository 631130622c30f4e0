//! Run-time component replacement (digest 002 §6.2.1), checked end to end.
//!
//! ```text
//! cargo build -p mutirao-cli -p mutirao-addr --examples
//! target/debug/mutirao run -n 3 target/debug/examples/replace
//! ```
//!
//! Rank 1 serves as the "analyser" (a mailbox registered with `service=analyser`). Rank 0, the
//! client, only ever addresses it by that property. Half-way, rank 1 deletes its mailbox and
//! rank 2 registers a replacement with the same properties. The client's next send reports a
//! delivery error; it queries the directory again, finds the replacement and resends; every
//! request is answered exactly once. Exits non-zero (with a message) when anything differs.

use mutirao_addr::{Acl, Addr, AddrError, AttrList, Mailbox, Match, Scope, Timeout};
use std::process::ExitCode;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
const REQUESTS: u32 = 10;
const SWITCH_AT: u32 = 5;

fn service() -> Result<AttrList, AddrError> {
    Ok(AttrList::from_pairs([
        ("service", "analyser"),
        ("example", "replace"),
    ])?)
}

/// Serves requests `first..last` on a mailbox with the service's properties, answering each
/// to the client's reply mailbox.
fn analyser(addr: &Addr, mb: &Mailbox<'_>, first: u32, last: u32) -> Result<(), String> {
    let reply_to = addr
        .find(
            &AttrList::from_pairs([("example", "replace-client")]).map_err(|e| e.to_string())?,
            Scope::Local,
        )
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("the client's reply mailbox is not registered")?;
    for want in first..last {
        let m = mb
            .recv(Match::tag(1), Timeout::After(T))
            .map_err(|e| e.to_string())?
            .ok_or(format!("request {want} never came to rank {}", addr.rank()))?;
        let n = u32::from_le_bytes(
            m.data
                .as_slice()
                .try_into()
                .map_err(|_| "bad request size")?,
        );
        if n != want {
            return Err(format!(
                "rank {} expected request {want}, got {n}",
                addr.rank()
            ));
        }
        let answer = format!("{n} analysed by rank {}", addr.rank()).into_bytes();
        let t = addr.send(&reply_to, 2, answer).map_err(|e| e.to_string())?;
        addr.wait(&t, T).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn run(addr: &Addr) -> Result<(), String> {
    let props = service().map_err(|e| e.to_string())?;
    let s = |e: AddrError| e.to_string();
    match addr.rank() {
        0 => {
            let replies = Mailbox::register(
                addr,
                &AttrList::from_pairs([("example", "replace-client")])
                    .map_err(|e| e.to_string())?,
                Acl::Public,
            )
            .map_err(s)?;
            addr.barrier(T).map_err(s)?; // 1: the original analyser is registered
            let mut cache = None;
            let mut failures = 0;
            for n in 0..REQUESTS {
                if n == SWITCH_AT {
                    addr.barrier(T).map_err(s)?; // 2: original deleted, replacement registered
                                                 // Show the failure the helper hides: the cached target is stale now.
                    if let Some(old) = &cache {
                        let t = addr.send(old, 1, b"stale".to_vec()).map_err(s)?;
                        match addr.wait(&t, T) {
                            Err(AddrError::Delivery { reason, .. }) => {
                                println!("client: send to the old analyser failed: {reason}");
                                failures += 1;
                            }
                            other => return Err(format!("stale send gave {other:?}")),
                        }
                    }
                }
                let to = addr
                    .send_by_properties(&mut cache, &props, Scope::Local, 1, &n.to_le_bytes(), T)
                    .map_err(s)?;
                let reply = replies
                    .recv(Match::tag(2), Timeout::After(T))
                    .map_err(s)?
                    .ok_or(format!("no reply to request {n}"))?;
                let text = String::from_utf8_lossy(&reply.data).into_owned();
                let want_rank = if n < SWITCH_AT { 1 } else { 2 };
                if to.rank != want_rank || text != format!("{n} analysed by rank {want_rank}") {
                    return Err(format!(
                        "request {n}: went to rank {}, reply {text:?}",
                        to.rank
                    ));
                }
                println!("client: {text}");
            }
            if failures != 1 {
                return Err(format!("expected one delivery failure, saw {failures}"));
            }
            addr.barrier(T).map_err(s)?; // 3
            println!("component replacement: OK");
        }
        1 => {
            let mb = Mailbox::register(addr, &props, Acl::Public).map_err(s)?;
            addr.barrier(T).map_err(s)?; // 1
            analyser(addr, &mb, 0, SWITCH_AT)?;
            mb.delete().map_err(s)?;
            addr.barrier(T).map_err(s)?; // 2 (serves the client's stale send while waiting)
            addr.barrier(T).map_err(s)?; // 3
        }
        2 => {
            addr.barrier(T).map_err(s)?; // 1
                                         // The replacement waits in the wings with the same properties.
            let mb = Mailbox::register(addr, &props, Acl::Public).map_err(s)?;
            addr.barrier(T).map_err(s)?; // 2
            analyser(addr, &mb, SWITCH_AT, REQUESTS)?;
            addr.barrier(T).map_err(s)?; // 3
        }
        _ => {
            for _ in 0..3 {
                addr.barrier(T).map_err(s)?;
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let world = match mutirao::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("replace: {e}");
            return ExitCode::FAILURE;
        }
    };
    if world.size() < 3 {
        eprintln!("replace: needs 3 ranks: mutirao run -n 3 target/debug/examples/replace");
        return ExitCode::FAILURE;
    }
    let res = Addr::connect(&world)
        .map_err(|e| e.to_string())
        .and_then(|addr| run(&addr));
    let fin = world.finalize();
    match (res, fin) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(e), _) => {
            eprintln!("replace: FAILED: {e}");
            ExitCode::FAILURE
        }
        (_, Err(e)) => {
            eprintln!("replace: finalize: {e}");
            ExitCode::FAILURE
        }
    }
}
