//! A running testbed as a mεμ physical resource specification (digest 002, Fig. 4.3 grammar):
//! the testbed is a domain, each site a domain under it, each host a domain under its site.
//! `mutirao testbed up` writes it as `NAME.meu`; `mutirao resources show|lookup` reads it, and
//! `mutirao calibrate --resources` takes the hosts' sites from it. Pure: text out, no I/O.
//!
//! Properties (integers are summed up the tree, other values match exactly):
//! - testbed: quality `testbed`; one `wan.SITE1.SITE2=MBIT` per WAN link (rounded);
//! - site: quality `site`;
//! - host: quality `host`, `addr=A.B.C.D` (exact), `cpu=SHARE` (exact, cores as in the spec),
//!   `cpu_milli=N` (thousandths of a core, summed: a site's total CPU) and
//!   `nic_mbit=N` (summed: the site's total access bandwidth, rounded to Mbit/s).
//!
//! ```text
//! g1: "g1" { testbed, wan.a.b=40 };
//! s0: "a" <g1> { site };
//! h0: "a1" <s0> { host, addr=10.213.0.2, cpu=1, cpu_milli=1000, nic_mbit=800 };
//! ```

use crate::TestbedState;
use std::fmt::Write as _;

/// Quotes a name for the spec grammar (always quoted: names may hold `.` or `-`).
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Formats a CPU share without float noise (`0.25`, `1`, `1.5`).
fn share(cpu: f64) -> String {
    let s = format!("{cpu:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The mεμ specification of testbed `name` in state `st`.
pub fn resource_spec(name: &str, st: &TestbedState) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "/* testbed {name}: sites and hosts for `mutirao resources` (digest 002, Fig. 4.3) */"
    );
    let mut root_props = vec!["testbed".to_string()];
    for w in &st.wans {
        root_props.push(format!(
            "{}={}",
            quoted(&format!("wan.{}.{}", w.sites[0], w.sites[1])),
            w.mbit.round().max(1.0) as i64
        ));
    }
    let _ = writeln!(out, "tb: {} {{ {} }};", quoted(name), root_props.join(", "));
    let mut sites: Vec<&str> = Vec::new();
    for h in &st.hosts {
        if !sites.contains(&h.site.as_str()) {
            sites.push(&h.site);
        }
    }
    for (i, s) in sites.iter().enumerate() {
        let _ = writeln!(out, "s{i}: {} <tb> {{ site }};", quoted(s));
    }
    for (i, h) in st.hosts.iter().enumerate() {
        let site = sites.iter().position(|s| *s == h.site).unwrap_or(0);
        let _ = writeln!(
            out,
            "h{i}: {} <s{site}> {{ host, addr={}, cpu={}, cpu_milli={}, nic_mbit={} }};",
            quoted(&h.name),
            quoted(&h.addr.to_string()),
            quoted(&share(h.cpu)),
            (h.cpu * 1000.0).round() as i64,
            h.nic_mbit.round().max(1.0) as i64
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HostInfo, WanInfo, STATE_FORMAT};

    fn host(name: &str, site: &str, addr: &str, cpu: f64, nic: f64) -> HostInfo {
        HostInfo {
            name: name.into(),
            site: site.into(),
            addr: addr.parse().unwrap(),
            cpu,
            nic_mbit: nic,
            netns: String::new(),
            cgroup: Default::default(),
        }
    }

    pub(crate) fn state() -> TestbedState {
        TestbedState {
            format: STATE_FORMAT.into(),
            prefix: "mt0".into(),
            block: "10.213.0.0/20".into(),
            namespaces: vec![],
            root_links: vec![],
            cgroup: Default::default(),
            hosts: vec![
                host("a1", "a", "10.213.0.2", 1.0, 800.0),
                host("a2", "a", "10.213.0.3", 0.25, 800.0),
                host("b1", "b", "10.213.1.2", 0.5, 200.0),
            ],
            wans: vec![WanInfo {
                sites: ["a".into(), "b".into()],
                mbit: 40.0,
            }],
            agents: vec![],
            hostfile: String::new(),
            packet_threads: Vec::new(),
        }
    }

    #[test]
    fn every_site_and_host_is_a_domain_with_its_properties() {
        let text = resource_spec("g1", &state());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + 1 + 2 + 3, "{text}");
        assert_eq!(lines[1], r#"tb: "g1" { testbed, "wan.a.b"=40 };"#);
        assert_eq!(lines[2], r#"s0: "a" <tb> { site };"#);
        assert_eq!(lines[3], r#"s1: "b" <tb> { site };"#);
        assert_eq!(
            lines[5],
            r#"h1: "a2" <s0> { host, addr="10.213.0.3", cpu="0.25", cpu_milli=250, nic_mbit=800 };"#
        );
        assert_eq!(
            lines[6],
            r#"h2: "b1" <s1> { host, addr="10.213.1.2", cpu="0.5", cpu_milli=500, nic_mbit=200 };"#
        );
    }

    #[test]
    fn names_are_quoted_and_escaped() {
        assert_eq!(quoted(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(share(1.0), "1");
        assert_eq!(share(0.125), "0.125");
        assert_eq!(share(1.5), "1.5");
    }
}
