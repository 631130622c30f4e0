//! An emulated heterogeneous grid on one Linux machine, built from a TOML spec.
//!
//! Each host is a network namespace with its own address, joined by a veth pair to its site's
//! bridge; both ends of every host link are shaped with `tc tbf` at the site's `nic_mbit`; sites
//! are joined by veth pairs shaped at the WAN's `mbit`; each host's processes run in a cgroup-v1
//! CPU quota (`cpu` cores; 5 ms period below a core, 10 ms from one core). Optionally one agent runs in each host. Everything made
//! carries a unique name prefix (`mtb` + 6 hex digits) and is removed when the [`Testbed`] is
//! dropped, when [`Testbed::down`] or [`teardown`] runs, and when [`Testbed::up`] fails half-way.
//! See `docs/testbed.md` for the layout, the addresses and the hostfile form.
//!
//! Spec parsing and the layout ([`Spec`], [`Plan`]) are pure; bringing a testbed up needs root.
//!
//! ```
//! use mutirao_testbed::{Plan, Spec};
//! let spec = Spec::parse(r#"
//! [[site]]
//! name = "a"
//! nic_mbit = 800
//! hosts = [ { name = "a1", cpu = 1.0 }, { name = "a2", cpu = 0.5 } ]
//! [[site]]
//! name = "b"
//! nic_mbit = 200
//! hosts = [ { name = "b1", cpu = 0.25 } ]
//! [[wan]]
//! sites = ["a", "b"]
//! mbit = 40
//! "#, 2)?;
//! let plan = Plan::new(&spec, "mtb00ab12", 0);
//! assert_eq!(plan.hosts[2].addr.to_string(), "10.213.1.1");
//! assert_eq!(plan.hosts[2].quota.quota_us, 1250); // 0.25 of a 5 ms period
//! # Ok::<(), mutirao_testbed::SpecError>(())
//! ```
//!
//! With root, the same spec becomes real namespaces (this example is not run by the doc tests):
//!
//! ```no_run
//! # use mutirao_testbed::{Spec, Testbed, UpOptions};
//! # let spec: Spec = unimplemented!();
//! let tb = Testbed::up(&spec, UpOptions::default())?;
//! let child = tb.spawn("b1", std::process::Command::new("hostname"))?;
//! println!("{}", tb.hostfile());
//! drop(tb); // kills `child` if still running, removes namespaces, links and cgroups
//! # Ok::<(), mutirao_testbed::Error>(())
//! ```

#![warn(missing_docs)]

pub mod plan;
pub mod resources;
pub mod spec;
pub mod sys;
mod testbed;

pub use plan::{hostfile, Plan};
pub use resources::resource_spec;
pub use spec::{HostSpec, SiteSpec, Spec, SpecError, WanSpec};
pub use sys::{is_root, live_prefixes, require_root, teardown, Teardown};
pub use testbed::{
    AgentInfo, AgentLaunch, HostInfo, Testbed, TestbedState, UpOptions, WanInfo, PACKET_NICE,
    STATE_FORMAT,
};

use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything that can go wrong bringing a testbed up, using it or tearing it down.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// Not running as root.
    #[error(
        "the testbed needs root (effective uid 0): it creates network namespaces, veth links, \
         tc qdiscs and cgroups; run it as root (e.g. with sudo)"
    )]
    NotRoot,
    /// A setup command failed.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// Its standard error.
        stderr: String,
    },
    /// A program could not be started.
    #[error(
        "cannot start `{program}`: {source} (the testbed needs iproute2: apt-get install iproute2)"
    )]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// A file operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: String,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// No cgroup-v1 hierarchy with the cpu controller.
    #[error(
        "no cgroup-v1 hierarchy with the cpu controller is mounted (see /proc/self/mounts); \
         mount one with `mkdir -p /sys/fs/cgroup/cpu && mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu`"
    )]
    NoCpuCgroup,
    /// Every address slot is in use.
    #[error(
        "all {} address blocks of 10.213.0.0/16 are used by other testbeds; take one down \
         (`mutirao testbed status`, `mutirao testbed down NAME`)",
        plan::SLOTS
    )]
    NoSlot,
    /// A prefix that is not `mtb` + 6 lower-case hex digits.
    #[error("`{0}` is not a testbed prefix (expected `mtb` followed by 6 lower-case hex digits)")]
    BadPrefix(String),
    /// The prefix is already used by namespaces, links or cgroups on this machine.
    #[error("prefix {0} is already in use on this machine; remove it with `mutirao testbed down {0}` or pick another")]
    PrefixInUse(String),
    /// No such host in the testbed.
    #[error("no host named `{0}` in this testbed")]
    UnknownHost(String),
    /// An agent did not come up.
    #[error("agent of host `{host}` (listening on {addr}) {problem}; its output: {log}")]
    Agent {
        /// The host.
        host: String,
        /// Where it should listen.
        addr: SocketAddr,
        /// What went wrong.
        problem: String,
        /// Where its output went.
        log: String,
    },
    /// The failure injected by [`UpOptions::fail_after_steps`].
    #[error("failure injected after {0} setup commands (UpOptions::fail_after_steps)")]
    Injected(usize),
    /// Teardown could not remove everything.
    #[error("teardown of testbed {prefix} left: {}; retry `mutirao testbed down {prefix}`", left.join(", "))]
    Leftovers {
        /// The testbed prefix.
        prefix: String,
        /// What is left.
        left: Vec<String>,
    },
}
