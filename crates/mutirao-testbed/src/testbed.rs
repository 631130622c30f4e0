//! `Testbed`: bring a spec up as namespaces, shaped links and cgroups; run processes inside its
//! hosts; tear it all down on drop.

use crate::plan::{self, is_prefix, Plan, Tbf, SLOTS};
use crate::spec::Spec;
use crate::sys::{self, Runner, Teardown};
use crate::Error;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How to start one agent per host. In `args`, `{addr}` becomes `ADDR:PORT` (the host's address
/// and `port`) and `{host}` the host's name.
#[derive(Debug, Clone)]
pub struct AgentLaunch {
    /// The agent program (e.g. the `mutirao` binary).
    pub program: PathBuf,
    /// Its arguments, e.g. `["agent", "--listen", "{addr}", "--token-file", "/run/x.token"]`.
    pub args: Vec<String>,
    /// The TCP port each agent listens on (every host has its own address, so one port serves all).
    pub port: u16,
    /// Directory for each agent's stdout+stderr (`PREFIX-HOST.log`); `None` discards them.
    pub log_dir: Option<PathBuf>,
    /// How long to wait for each agent's port to accept connections.
    pub ready_timeout: Duration,
}

/// Options of [`Testbed::up`].
#[derive(Debug, Clone, Default)]
pub struct UpOptions {
    /// Name prefix to use (`mtb` + 6 lower-case hex digits); random when `None`.
    pub prefix: Option<String>,
    /// Start an agent in every host.
    pub agent: Option<AgentLaunch>,
    /// For tests of the cleanup path: fail as if a setup command had failed once this many
    /// setup commands have run.
    pub fail_after_steps: Option<usize>,
    /// Run the links' packet work in kernel threads instead of on whichever host's CPU quota
    /// the packets interrupt (see `PacketWork`).
    pub packet_threads: bool,
}

/// A host of a running testbed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    /// Name from the spec.
    pub name: String,
    /// Name of its site.
    pub site: String,
    /// Its address; every other host and the root namespace reach it.
    pub addr: Ipv4Addr,
    /// Its CPU share in cores (the cgroup quota).
    pub cpu: f64,
    /// Rate of its link to the site switch, in Mbit/s.
    pub nic_mbit: f64,
    /// Its network namespace (usable with `ip netns exec`).
    pub netns: String,
    /// Its cgroup directory in the cpu hierarchy.
    pub cgroup: PathBuf,
}

/// A WAN link of a running testbed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WanInfo {
    /// The two sites it joins.
    pub sites: [String; 2],
    /// Its rate in Mbit/s.
    pub mbit: f64,
}

/// A running agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// Host it runs in.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// `ADDR:PORT` it listens on.
    pub listen: SocketAddr,
}

/// Everything that describes a running testbed; what `mutirao testbed up` saves so that
/// `status` and `down` can find it again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestbedState {
    /// Always [`STATE_FORMAT`].
    pub format: String,
    /// Name prefix of every namespace, root link and cgroup it made.
    pub prefix: String,
    /// Address block it owns (`10.213.X.0/20`).
    pub block: String,
    /// Network namespaces it made (sites and hosts).
    pub namespaces: Vec<String>,
    /// Links it made in the root namespace (one per site; each routes to that site's /24).
    pub root_links: Vec<String>,
    /// Its cgroup directory (one child per host).
    pub cgroup: PathBuf,
    /// Its hosts in spec order.
    pub hosts: Vec<HostInfo>,
    /// Its WAN links.
    pub wans: Vec<WanInfo>,
    /// Its agents (empty without agents).
    pub agents: Vec<AgentInfo>,
    /// The hostfile text (see [`crate::plan::hostfile`]).
    pub hostfile: String,
    /// Process ids of the kernel threads that do its links' packet work (threaded NAPI, see
    /// `PacketWork`); empty where the kernel or system could not move that work off the hosts
    /// (and in states saved before 2026-11-27).
    #[serde(default)]
    pub packet_threads: Vec<i32>,
}

/// Format tag of [`TestbedState`].
pub const STATE_FORMAT: &str = "mutirao-testbed-state/1";

/// A running emulated grid. Dropping it (or [`Testbed::down`]) kills its processes and removes
/// everything it made.
#[derive(Debug)]
pub struct Testbed {
    state: TestbedState,
    agents: Vec<Child>,
    active: bool,
}

fn ncores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn write_file(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        what: "cannot write".into(),
        path: path.to_path_buf(),
        source,
    })
}

/// Shell snippet run inside a fresh namespace: IPv6 off (no router solicitations or other
/// chatter on measured links), reverse-path filtering off, forwarding as given.
fn ns_sysctl(forward: bool) -> String {
    format!(
        "echo {} > /proc/sys/net/ipv4/ip_forward && \
         echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter && \
         echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter && \
         for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; \
         do if [ -w $f ]; then echo 1 > $f; fi; done",
        u8::from(forward)
    )
}

impl Testbed {
    /// Bring `spec` up. Needs root. On any failure everything made so far is removed before the
    /// error is returned.
    pub fn up(spec: &Spec, opts: UpOptions) -> Result<Testbed, Error> {
        spec.validate(ncores())?;
        sys::require_root()?;
        let cg_root = sys::cpu_cgroup_root()?;
        let prefix = match &opts.prefix {
            Some(p) if is_prefix(p) => p.clone(),
            Some(p) => return Err(Error::BadPrefix(p.clone())),
            None => sys::random_prefix()?,
        };
        if sys::live_prefixes().contains(&prefix) {
            return Err(Error::PrefixInUse(prefix));
        }
        // From here on, dropping `tb` tears down everything with the prefix.
        let mut tb = Testbed {
            state: TestbedState {
                format: STATE_FORMAT.into(),
                prefix: prefix.clone(),
                block: String::new(),
                namespaces: Vec::new(),
                root_links: Vec::new(),
                cgroup: cg_root.join(&prefix),
                hosts: Vec::new(),
                wans: Vec::new(),
                agents: Vec::new(),
                hostfile: String::new(),
                packet_threads: Vec::new(),
            },
            agents: Vec::new(),
            active: true,
        };
        let mut r = Runner {
            steps: 0,
            fail_after: opts.fail_after_steps,
        };
        tb.build(spec, &mut r, opts.packet_threads)?;
        if let Some(agent) = &opts.agent {
            tb.start_agents(agent)?;
        }
        let hosts: Vec<(Ipv4Addr, f64)> = tb.state.hosts.iter().map(|h| (h.addr, h.cpu)).collect();
        tb.state.hostfile = plan::hostfile(&hosts, opts.agent.as_ref().map(|a| a.port));
        Ok(tb)
    }

    fn build(&mut self, spec: &Spec, r: &mut Runner, packet_threads: bool) -> Result<(), Error> {
        let prefix = self.state.prefix.clone();
        let st = &mut self.state;
        let mut pw = PacketWork {
            threaded: packet_threads,
            threads: Vec::new(),
        };

        // Site namespaces first: the address slot is claimed through site 0's control link.
        let site_ns: Vec<String> = (0..spec.sites.len())
            .map(|s| format!("{prefix}-s{s}"))
            .collect();
        for ns in &site_ns {
            r.run("ip", &["netns", "add", ns])?;
            st.namespaces.push(ns.clone());
            r.run("ip", &["netns", "exec", ns, "sh", "-c", &ns_sysctl(true)])?;
            r.run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        let link0 = format!("{prefix}c0");
        r.run(
            "ip",
            &[
                "link",
                "add",
                &link0,
                "type",
                "veth",
                "peer",
                "name",
                "ctl",
                "netns",
                &site_ns[0],
            ],
        )?;
        st.root_links.push(link0.clone());
        disable_ipv6_root(&link0);
        r.run("ip", &["link", "set", &link0, "up"])?;
        let start = sys::random_bytes(1)?[0] % SLOTS;
        let mut claimed = None;
        for i in 0..SLOTS {
            let slot = (start + i) % SLOTS;
            let p = Plan::new(spec, &prefix, slot);
            let s0 = &p.sites[0];
            r.run(
                "ip",
                &[
                    "addr",
                    "add",
                    &format!("{}/30", s0.root_addr),
                    "dev",
                    &link0,
                ],
            )?;
            let claim = r.run(
                "ip",
                &[
                    "route",
                    "add",
                    &format!("{}/24", s0.net),
                    "via",
                    &s0.ctl_addr.to_string(),
                    "dev",
                    &link0,
                    "onlink",
                ],
            );
            match claim {
                Ok(_) => {
                    claimed = Some(p);
                    break;
                }
                Err(Error::Command { stderr, .. }) if stderr.contains("File exists") => {
                    r.run("ip", &["addr", "flush", "dev", &link0])?;
                }
                Err(e) => return Err(e),
            }
        }
        let p = claimed.ok_or(Error::NoSlot)?;
        st.block = p.block();

        // Sites: bridge with the gateway address, control link to the root namespace.
        for (s, site) in p.sites.iter().enumerate() {
            let ns = site.netns.as_str();
            r.run("ip", &["-n", ns, "link", "add", "br0", "type", "bridge"])?;
            r.run(
                "ip",
                &[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{}/24", site.gateway),
                    "dev",
                    "br0",
                ],
            )?;
            r.run("ip", &["-n", ns, "link", "set", "br0", "up"])?;
            if s > 0 {
                let link = site.root_link.as_str();
                r.run(
                    "ip",
                    &[
                        "link", "add", link, "type", "veth", "peer", "name", "ctl", "netns", ns,
                    ],
                )?;
                st.root_links.push(link.to_string());
                disable_ipv6_root(link);
                r.run(
                    "ip",
                    &[
                        "addr",
                        "add",
                        &format!("{}/30", site.root_addr),
                        "dev",
                        link,
                    ],
                )?;
                r.run("ip", &["link", "set", link, "up"])?;
                r.run(
                    "ip",
                    &[
                        "route",
                        "add",
                        &format!("{}/24", site.net),
                        "via",
                        &site.ctl_addr.to_string(),
                        "dev",
                        link,
                        "onlink",
                    ],
                )?;
            }
            r.run(
                "ip",
                &[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{}/30", site.ctl_addr),
                    "dev",
                    "ctl",
                ],
            )?;
            r.run("ip", &["-n", ns, "link", "set", "ctl", "up"])?;
            r.run(
                "ip",
                &[
                    "-n",
                    ns,
                    "route",
                    "add",
                    &format!("{}/26", p.control_net),
                    "via",
                    &site.root_addr.to_string(),
                    "dev",
                    "ctl",
                    "onlink",
                ],
            )?;
        }

        // Cgroup of the testbed.
        std::fs::create_dir(&st.cgroup).map_err(|source| Error::Io {
            what: "cannot create cgroup".into(),
            path: st.cgroup.clone(),
            source,
        })?;
        write_file(&st.cgroup.join("cpu.shares"), &plan::MAX_SHARES.to_string())?;

        // Hosts: namespace, veth to the site bridge, tbf on both ends, address, default route, cgroup.
        for h in &p.hosts {
            let site = &p.sites[h.site];
            let (hns, sns) = (h.netns.as_str(), site.netns.as_str());
            r.run("ip", &["netns", "add", hns])?;
            st.namespaces.push(hns.to_string());
            r.run("ip", &["netns", "exec", hns, "sh", "-c", &ns_sysctl(false)])?;
            r.run(
                "ip",
                &[
                    "-n", sns, "link", "add", &h.port, "type", "veth", "peer", "name", "eth0",
                    "netns", hns,
                ],
            )?;
            r.run(
                "ip",
                &["-n", sns, "link", "set", &h.port, "master", "br0", "up"],
            )?;
            r.run("ip", &["-n", hns, "link", "set", "lo", "up"])?;
            r.run(
                "ip",
                &[
                    "-n",
                    hns,
                    "addr",
                    "add",
                    &format!("{}/24", h.addr),
                    "dev",
                    "eth0",
                ],
            )?;
            r.run("ip", &["-n", hns, "link", "set", "eth0", "up"])?;
            r.run(
                "ip",
                &[
                    "-n",
                    hns,
                    "route",
                    "add",
                    "default",
                    "via",
                    &site.gateway.to_string(),
                ],
            )?;
            shape(
                r,
                &mut pw,
                hns,
                "eth0",
                &h.nic,
                &p.pairs_through(hns, "eth0"),
            )?;
            shape(
                r,
                &mut pw,
                sns,
                &h.port,
                &h.nic,
                &p.pairs_through(sns, &h.port),
            )?;
            let cg = st.cgroup.join(&h.cgroup);
            std::fs::create_dir(&cg).map_err(|source| Error::Io {
                what: "cannot create cgroup".into(),
                path: cg.clone(),
                source,
            })?;
            write_file(
                &cg.join("cpu.cfs_period_us"),
                &h.quota.period_us.to_string(),
            )?;
            write_file(&cg.join("cpu.cfs_quota_us"), &h.quota.quota_us.to_string())?;
            // Older kernels have no burst; the quota alone still caps the host.
            let burst = cg.join("cpu.cfs_burst_us");
            if burst.exists() && h.quota.burst_us > 0 {
                write_file(&burst, &h.quota.burst_us.to_string())?;
            }
            write_file(&cg.join("cpu.shares"), &h.quota.shares.to_string())?;
            st.hosts.push(HostInfo {
                name: h.name.clone(),
                site: site.name.clone(),
                addr: h.addr,
                cpu: h.cpu,
                nic_mbit: h.nic.rate_kbit as f64 / 1000.0,
                netns: h.netns.clone(),
                cgroup: cg,
            });
        }

        // WAN links: a veth pair between two site namespaces, tbf on both ends.
        for (w, wan) in p.wans.iter().enumerate() {
            let (na, nb) = (p.sites[wan.a].netns.as_str(), p.sites[wan.b].netns.as_str());
            let ifn = wan.ifname.as_str();
            r.run(
                "ip",
                &[
                    "-n", na, "link", "add", ifn, "type", "veth", "peer", "name", ifn, "netns", nb,
                ],
            )?;
            r.run(
                "ip",
                &[
                    "-n",
                    na,
                    "addr",
                    "add",
                    &format!("{}/31", wan.addr_a),
                    "dev",
                    ifn,
                ],
            )?;
            r.run(
                "ip",
                &[
                    "-n",
                    nb,
                    "addr",
                    "add",
                    &format!("{}/31", wan.addr_b),
                    "dev",
                    ifn,
                ],
            )?;
            r.run("ip", &["-n", na, "link", "set", ifn, "up"])?;
            r.run("ip", &["-n", nb, "link", "set", ifn, "up"])?;
            shape(r, &mut pw, na, ifn, &wan.tbf, &p.pairs_through(na, ifn))?;
            shape(r, &mut pw, nb, ifn, &wan.tbf, &p.pairs_through(nb, ifn))?;
            st.wans.push(WanInfo {
                sites: [p.sites[wan.a].name.clone(), p.sites[wan.b].name.clone()],
                mbit: spec.wans[w].mbit,
            });
        }
        for route in &p.routes {
            r.run(
                "ip",
                &[
                    "-n",
                    &p.sites[route.site].netns,
                    "route",
                    "add",
                    &format!("{}/24", route.dest),
                    "via",
                    &route.via.to_string(),
                    "dev",
                    &route.dev,
                    "onlink",
                ],
            )?;
        }
        pw.prioritize();
        st.packet_threads = pw.threads;
        Ok(())
    }

    fn start_agents(&mut self, a: &AgentLaunch) -> Result<(), Error> {
        for i in 0..self.state.hosts.len() {
            let host = self.state.hosts[i].clone();
            let listen = SocketAddr::from((host.addr, a.port));
            let mut cmd = Command::new(&a.program);
            cmd.args(a.args.iter().map(|s| {
                s.replace("{addr}", &listen.to_string())
                    .replace("{host}", &host.name)
            }));
            cmd.stdin(Stdio::null());
            let log = a
                .log_dir
                .as_ref()
                .map(|d| d.join(format!("{}-{}.log", self.state.prefix, host.name)));
            match &log {
                Some(path) => {
                    let f = File::create(path).map_err(|source| Error::Io {
                        what: "cannot create agent log".into(),
                        path: path.clone(),
                        source,
                    })?;
                    let f2 = f.try_clone().map_err(|source| Error::Io {
                        what: "cannot duplicate".into(),
                        path: path.clone(),
                        source,
                    })?;
                    cmd.stdout(f).stderr(f2);
                }
                None => {
                    cmd.stdout(Stdio::null()).stderr(Stdio::null());
                }
            }
            // Its own process group: a Ctrl-C meant for `mutirao testbed up` does not reach it.
            cmd.process_group(0);
            let child = self.spawn(&host.name, cmd)?;
            self.state.agents.push(AgentInfo {
                host: host.name.clone(),
                pid: child.id(),
                listen,
            });
            self.agents.push(child);
        }
        for i in 0..self.agents.len() {
            let info = self.state.agents[i].clone();
            let log = a.log_dir.as_ref().map_or_else(
                || "(discarded)".to_string(),
                |d| {
                    d.join(format!("{}-{}.log", self.state.prefix, info.host))
                        .display()
                        .to_string()
                },
            );
            let fail = |problem: String| Error::Agent {
                host: info.host.clone(),
                addr: info.listen,
                problem,
                log: log.clone(),
            };
            let deadline = Instant::now() + a.ready_timeout;
            loop {
                if let Some(status) = self.agents[i]
                    .try_wait()
                    .map_err(|e| fail(format!("cannot be waited for: {e}")))?
                {
                    return Err(fail(format!("exited before listening ({status})")));
                }
                if TcpStream::connect_timeout(&info.listen, Duration::from_millis(200)).is_ok() {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(fail(format!(
                        "did not accept connections within {:?}",
                        a.ready_timeout
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Start `cmd` inside host `host`: in its network namespace and its CPU cgroup (children it
    /// starts stay in both). The caller owns the returned child; teardown kills it if still running.
    pub fn spawn(&self, host: &str, mut cmd: Command) -> Result<Child, Error> {
        let h = self
            .host(host)
            .ok_or_else(|| Error::UnknownHost(host.to_string()))?;
        let ns_path = Path::new(sys::NETNS_DIR).join(&h.netns);
        let ns = File::open(&ns_path).map_err(|source| Error::Io {
            what: "cannot open network namespace".into(),
            path: ns_path.clone(),
            source,
        })?;
        let procs_path = h.cgroup.join("cgroup.procs");
        let procs = OpenOptions::new()
            .write(true)
            .open(&procs_path)
            .map_err(|source| Error::Io {
                what: "cannot open".into(),
                path: procs_path.clone(),
                source,
            })?;
        // SAFETY: the closure runs in the forked child before exec. It only formats the pid into
        // a stack buffer and makes three system calls (getpid, write, setns) on file descriptors
        // opened above, before the fork, and owned by the closure; it allocates nothing and takes
        // no lock, so it is async-signal-safe as `pre_exec` requires.
        unsafe {
            cmd.pre_exec(move || {
                let pid = rustix::process::getpid().as_raw_pid();
                let mut buf = [0u8; 12];
                let len = format_pid(pid, &mut buf);
                (&procs).write_all(&buf[..len])?;
                rustix::thread::move_into_link_name_space(
                    ns.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )?;
                Ok(())
            });
        }
        cmd.spawn().map_err(|source| Error::Spawn {
            program: cmd.get_program().to_string_lossy().into_owned(),
            source,
        })
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> Option<&HostInfo> {
        self.state.hosts.iter().find(|h| h.name == name)
    }

    /// All hosts in spec order.
    pub fn hosts(&self) -> &[HostInfo] {
        &self.state.hosts
    }

    /// The name prefix of everything this testbed made.
    pub fn prefix(&self) -> &str {
        &self.state.prefix
    }

    /// The hostfile text: one `ADDR slots=N port=P` line per host.
    pub fn hostfile(&self) -> &str {
        &self.state.hostfile
    }

    /// The full description of this testbed.
    pub fn state(&self) -> &TestbedState {
        &self.state
    }

    /// Leave the testbed running past this object (for `mutirao testbed up`): no teardown on
    /// drop; agents keep running. Remove it later with [`crate::teardown`] on its prefix.
    pub fn detach(mut self) -> TestbedState {
        self.active = false;
        std::mem::take(&mut self.agents);
        self.state.clone()
    }

    /// Tear down now and report what was removed.
    pub fn down(mut self) -> Result<Teardown, Error> {
        self.active = false;
        self.stop()
    }

    fn stop(&mut self) -> Result<Teardown, Error> {
        for c in &mut self.agents {
            sys::kill(c.id() as i32);
        }
        let result = sys::teardown(&self.state.prefix);
        for c in &mut self.agents {
            // Reap the killed agents; an error means it was already reaped.
            let _ = c.wait();
        }
        self.agents.clear();
        result
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if self.active {
            self.active = false;
            if let Err(e) = self.stop() {
                eprintln!("mutirao-testbed: teardown of {}: {e}", self.state.prefix);
            }
        }
    }
}

/// Nice value of the testbed's packet threads (see [`PacketWork`]).
pub const PACKET_NICE: i32 = -20;

/// Where the kernel's packet work of the emulated network runs (`UpOptions::packet_threads`:
/// off by default here, on in `mutirao testbed up` unless `--no-packet-threads`).
///
/// Left alone, a packet crossing the testbed is processed in softirq context on whichever CPU
/// it reaches, and the kernel (without `CONFIG_IRQ_TIME_ACCOUNTING`, as Debian's) charges that
/// time to the task it interrupted: link timers, bridge hops and receivers' TCP work land on the
/// CPU quota of whichever host happens to be computing. With `packet_threads`, every shaped
/// veth gets TSO off and GRO on (veth then hands each frame to its peer's NAPI),
/// `gro_max_size` of one frame (frames stay unmerged, so the token buckets see the same
/// packets), and threaded NAPI: the receive work runs in a `napi/<dev>-<id>` kernel thread
/// outside every host's cgroup, at nice [`PACKET_NICE`] (not real-time: SCHED_FIFO cost 3–5×
/// the CPU per frame). A system without these (no `ethtool`, an old kernel) gets one warning
/// and softirq handling. The library keeps it off because a frame then waits for a thread at
/// every hop, which makes link timings stray when other work loads the machine (the root tests
/// time links beside other tests). Measurements: docs/testbed.md, "Packet work off the hosts".
struct PacketWork {
    /// Still setting interfaces up (false after the first failure, which was warned about).
    threaded: bool,
    /// The threaded-NAPI workers made for this testbed's interfaces.
    threads: Vec<i32>,
}

impl PacketWork {
    /// Threaded NAPI for `dev` of `ns` (see [`PacketWork`]).
    fn thread(&mut self, r: &mut Runner, ns: &str, dev: &str) -> Result<(), Error> {
        if !self.threaded {
            return Ok(());
        }
        let before = sys::napi_threads(dev);
        let gro_on = [
            "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gro", "on",
        ];
        let gro_max = ["-n", ns, "link", "set", "dev", dev, "gro_max_size", "1500"];
        let threaded = format!("/sys/class/net/{dev}/threaded");
        let tee = ["netns", "exec", ns, "tee", threaded.as_str()];
        // (what failed, whether GRO was already on)
        let mut failed = optional(r.run("ip", &gro_on))?.map(|e| (e, false));
        if failed.is_none() {
            failed = optional(r.run("ip", &gro_max))?.map(|e| (e, true));
        }
        if failed.is_none() {
            failed = optional(r.run_input("ip", &tee, "1\n"))?.map(|e| (e, true));
        }
        if let Some((e, gro_is_on)) = failed {
            self.threaded = false;
            eprintln!(
                "mutirao-testbed: warning: {ns} {dev}: cannot move the emulated network's \
                 packet work into kernel threads ({e}); it runs on whichever host's CPU \
                 quota the packets interrupt, so hosts compute slower while traffic \
                 flows. Install ethtool (apt install ethtool) on a kernel ≥ 5.19."
            );
            if gro_is_on {
                // GRO on without `gro_max_size` would merge frames into super-packets that
                // the next token bucket passes whole: put the interface back as it was.
                let undo = [
                    "netns", "exec", ns, "ethtool", "-K", dev, "gro", "off", "tso", "on",
                ];
                if let Some(e) = optional(r.run("ip", &undo))? {
                    eprintln!(
                        "mutirao-testbed: warning: {ns} {dev}: cannot turn GRO off again \
                         ({e}); frames merged on it may pass the next link's bucket whole"
                    );
                }
            }
            return Ok(());
        }
        // The workers that appeared for a device of this name (a testbed coming up at the same
        // moment in another process could add its own; raising its priority too is harmless).
        let after = sys::napi_threads(dev);
        self.threads.extend(after.difference(&before));
        Ok(())
    }

    /// The highest nice priority ([`PACKET_NICE`]) for the threaded-NAPI workers this testbed
    /// made.
    fn prioritize(&self) {
        for &pid in &self.threads {
            let set = rustix::process::Pid::from_raw(pid)
                .ok_or(rustix::io::Errno::SRCH)
                .and_then(|p| rustix::process::setpriority_process(Some(p), PACKET_NICE));
            if let Err(e) = set {
                eprintln!(
                    "mutirao-testbed: warning: cannot raise the priority of packet thread {pid} \
                     ({e}); frames may wait behind busy hosts"
                );
            }
        }
    }
}

/// The outcome of a setup step the testbed can do without: `Ok(None)` done, `Ok(Some(e))`
/// failed (the caller warns and goes on), `Err` a test's injected failure, which must stop the
/// bring-up like any other step's.
fn optional(done: Result<String, Error>) -> Result<Option<Error>, Error> {
    match done {
        Ok(_) => Ok(None),
        Err(e @ Error::Injected(_)) => Err(e),
        Err(e) => Ok(Some(e)),
    }
}

/// Shape `dev` of namespace `ns`: packet work in kernel threads ([`PacketWork`]), the token
/// bucket, acknowledgements first, and one queue per host pair of `pairs` (the pairs whose
/// packets leave through it, `Plan::pairs_through`).
fn shape(
    r: &mut Runner,
    pw: &mut PacketWork,
    ns: &str,
    dev: &str,
    tbf: &Tbf,
    pairs: &[(Ipv4Addr, Ipv4Addr)],
) -> Result<(), Error> {
    let mut gso = vec!["-n", ns, "link", "set", "dev", dev];
    gso.extend(plan::GSO_ARGS);
    r.run("ip", &gso)?;
    pw.thread(r, ns, dev)?;
    let mut args: Vec<String> = ["-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(tbf.tc_args());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    r.run("tc", &refs)?;
    // Acknowledgements ahead of bulk data (see `Tbf::ack_first_args`). A kernel without htb or
    // u32 keeps the tbf's plain FIFO: the link still has its rate, with a warning.
    for cmd in tbf.ack_first_args(dev) {
        let mut a = vec!["-n", ns];
        a.extend(cmd.iter().map(String::as_str));
        if let Some(e) = optional(r.run("tc", &a))? {
            eprintln!(
                "mutirao-testbed: warning: {ns} {dev}: small packets cannot go ahead of bulk \
                 data ({e}); traffic in one direction will slow acknowledgements of the other"
            );
            let _ = r.run(
                "tc",
                &["-n", ns, "qdisc", "del", "dev", dev, "parent", "1:1"],
            );
            return Ok(());
        }
    }
    // One queue per host pair (see `plan::flow_queue_batch`). Without it the link still has
    // its rate and acknowledgements first, but concurrent flows share it as TCP over one FIFO
    // does: unevenly, and differently from run to run.
    if pairs.len() > plan::MAX_FLOW_QUEUES {
        eprintln!(
            "mutirao-testbed: warning: {ns} {dev} carries {} host pairs, more than the {} it \
             queues separately; its flows share one FIFO (unevenly, unlike the max-min fair \
             model)",
            pairs.len(),
            plan::MAX_FLOW_QUEUES
        );
        return Ok(());
    }
    let batch = plan::flow_queue_batch(dev, pairs, tbf.limit_bytes);
    if !batch.is_empty() {
        if let Some(e) = optional(r.run_input("tc", &["-n", ns, "-batch", "-"], &batch))? {
            eprintln!(
                "mutirao-testbed: warning: {ns} {dev}: flows cannot have queues of their own \
                 ({e}); concurrent flows will share the link unevenly"
            );
        }
    }
    Ok(())
}

fn disable_ipv6_root(link: &str) {
    // Best effort: keeps the root side of a control link quiet; absent without IPv6.
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{link}/disable_ipv6"), "1");
}

/// Write the decimal digits of `pid` into `buf` without allocating; returns their count.
fn format_pid(pid: i32, buf: &mut [u8; 12]) -> usize {
    let mut n = pid.unsigned_abs();
    let mut tmp = [0u8; 12];
    let mut len = 0;
    loop {
        tmp[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 || len == tmp.len() {
            break;
        }
    }
    for i in 0..len {
        buf[i] = tmp[len - 1 - i];
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_format_without_allocation() {
        let mut b = [0u8; 12];
        let n = format_pid(4194304, &mut b);
        assert_eq!(&b[..n], b"4194304");
        let n = format_pid(7, &mut b);
        assert_eq!(&b[..n], b"7");
    }
}
