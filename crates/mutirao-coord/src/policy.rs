//! The owner's policy (InteGrade's NCC): when may the grid use this host? Pure: a policy
//! parsed from its TOML text, an [`Observation`] of the host in, a decision out. The agent
//! measures ([`crate::owner`]) and acts; nothing here reads a clock or a file.
//!
//! ```toml
//! # /etc/mutirao/owner.toml — every key is optional
//! max_load = 1.5             # the owner's own load: cores of CPU time used by processes not the grid's
//! min_idle_cpu = 0.5         # cores left idle by the owner's own work
//! hours = "18:00-08:00"      # the grid may run only in this window (local time; may cross midnight)
//! days = ["mon", "tue", "wed", "thu", "fri"]   # days the window may start on (default: every day)
//! all_day = ["sat", "sun"]   # days the grid may use at any hour
//! input_idle_s = 300         # keyboard and mouse untouched this long (where measurable)
//! grace_s = 60               # suspended this long before the grid vacates the host
//! active_file = "/run/mutirao/owner-active"   # the owner is active while this file exists
//! ```
//!
//! The host moves between three states ([`step`]): `available` (the grid may run), `suspend`
//! (the owner is back: the grid's processes are stopped, not killed) and `vacate` (the owner
//! stayed for the grace period: the grid leaves). A host never goes from `available` to
//! `vacate` without being `suspend` for the grace period first.

use serde::{Deserialize, Serialize};

/// What the owner's policy allows now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OwnerState {
    /// The grid may use the host.
    #[default]
    Available,
    /// The owner is active: the grid's processes here are stopped, not yet removed.
    Suspend,
    /// The owner stayed active for the grace period: the grid must leave this host.
    Vacate,
}

impl OwnerState {
    /// The name reported and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            OwnerState::Available => "available",
            OwnerState::Suspend => "suspend",
            OwnerState::Vacate => "vacate",
        }
    }
}

impl std::fmt::Display for OwnerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The policy file as written (every key optional).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyText {
    max_load: Option<f64>,
    min_idle_cpu: Option<f64>,
    hours: Option<String>,
    days: Option<Vec<String>>,
    all_day: Option<Vec<String>>,
    input_idle_s: Option<f64>,
    grace_s: Option<f64>,
    active_file: Option<String>,
}

/// A parsed owner policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Most own load the owner's work may have with the grid running.
    pub max_load: Option<f64>,
    /// Fewest idle cores the owner's work must leave.
    pub min_idle_cpu: Option<f64>,
    /// The window the grid may run in, minutes from midnight `[start, end)`; `start > end`
    /// crosses midnight.
    pub hours: Option<(u16, u16)>,
    /// Days (bit 0 Monday … bit 6 Sunday) a window may start on.
    pub days: u8,
    /// Days the grid may use at any hour.
    pub all_day: u8,
    /// Keyboard and mouse untouched at least this long, seconds.
    pub input_idle_s: Option<f64>,
    /// Suspended this long before vacating, ms.
    pub grace_ms: i64,
    /// The owner is active while this file exists.
    pub active_file: Option<String>,
}

/// Default grace period, seconds.
pub const DEFAULT_GRACE_S: f64 = 60.0;
const ALL_DAYS: u8 = 0x7f;
const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

impl Default for Policy {
    /// No condition: the host is always available (the agent's behaviour without a policy).
    fn default() -> Self {
        Policy {
            max_load: None,
            min_idle_cpu: None,
            hours: None,
            days: ALL_DAYS,
            all_day: 0,
            input_idle_s: None,
            grace_ms: (DEFAULT_GRACE_S * 1000.0) as i64,
            active_file: None,
        }
    }
}

/// `"18:00"` → minutes from midnight (`"24:00"` is 1440).
fn parse_clock(s: &str) -> Option<u16> {
    let (h, m) = s.trim().split_once(':')?;
    let (h, m): (u16, u16) = (h.trim().parse().ok()?, m.trim().parse().ok()?);
    (m < 60 && (h < 24 || (h == 24 && m == 0))).then_some(h * 60 + m)
}

/// `"18:00-08:00"` → (1080, 480).
pub fn parse_hours(s: &str) -> Result<(u16, u16), String> {
    let bad =
        || format!("hours = {s:?}: expected \"HH:MM-HH:MM\" in local time, e.g. \"18:00-08:00\"");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let (a, b) = (
        parse_clock(a).ok_or_else(bad)?,
        parse_clock(b).ok_or_else(bad)?,
    );
    if a == b {
        return Err(format!(
            "hours = {s:?} is an empty window; leave `hours` out to allow every hour"
        ));
    }
    Ok((a, b))
}

fn parse_days(key: &str, days: &[String]) -> Result<u8, String> {
    let mut mask = 0u8;
    for d in days {
        let l = d.trim().to_ascii_lowercase();
        let i = DAY_NAMES
            .iter()
            .position(|n| l.starts_with(n))
            .ok_or_else(|| {
                format!("{key}: {d:?} is not a day; use mon, tue, wed, thu, fri, sat, sun")
            })?;
        mask |= 1 << i;
    }
    Ok(mask)
}

fn non_negative(key: &str, v: Option<f64>) -> Result<Option<f64>, String> {
    match v {
        Some(x) if !x.is_finite() || x < 0.0 => {
            Err(format!("{key} = {x}: expected a number of at least 0"))
        }
        other => Ok(other),
    }
}

impl Policy {
    /// Parse a policy file's TOML text; the error names the key and what is expected.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let t: PolicyText = toml::from_str(text).map_err(|e| format!("owner policy: {e}"))?;
        let grace = non_negative("grace_s", t.grace_s)?.unwrap_or(DEFAULT_GRACE_S);
        if grace > 7.0 * 86400.0 {
            return Err(format!("grace_s = {grace}: at most a week (604800)"));
        }
        let days = match &t.days {
            Some(d) if d.is_empty() => {
                return Err("days = []: no day at all; leave `days` out for every day".into())
            }
            Some(d) => parse_days("days", d)?,
            None => ALL_DAYS,
        };
        if t.days.is_some() && t.hours.is_none() {
            return Err("days without hours: `days` names the days the `hours` window may start on; use all_day for whole days".into());
        }
        Ok(Policy {
            max_load: non_negative("max_load", t.max_load)?,
            min_idle_cpu: non_negative("min_idle_cpu", t.min_idle_cpu)?,
            hours: t.hours.as_deref().map(parse_hours).transpose()?,
            days,
            all_day: parse_days("all_day", t.all_day.as_deref().unwrap_or(&[]))?,
            input_idle_s: non_negative("input_idle_s", t.input_idle_s)?,
            grace_ms: (grace * 1000.0).round() as i64,
            active_file: t.active_file.filter(|f| !f.trim().is_empty()),
        })
    }

    /// May the grid run at `weekday` (0 Monday … 6 Sunday), `minute` from midnight, as far
    /// as the hours and days go?
    pub fn in_hours(&self, weekday: u8, minute: u16) -> bool {
        let weekday = weekday % 7;
        if self.all_day & (1 << weekday) != 0 {
            return true;
        }
        let Some((start, end)) = self.hours else {
            return true;
        };
        let yesterday = (weekday + 6) % 7;
        let started_on = if start < end {
            (start <= minute && minute < end).then_some(weekday)
        } else if minute >= start {
            Some(weekday)
        } else if minute < end {
            Some(yesterday)
        } else {
            None
        };
        started_on.is_some_and(|d| self.days & (1 << d) != 0)
    }
}

/// What the agent measured, for [`owner_reasons`].
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// Local day of the week, 0 Monday … 6 Sunday.
    pub weekday: u8,
    /// Local minutes since midnight.
    pub minute: u16,
    /// The owner's own load (the 1-minute load minus the grid's running ranks, at least 0).
    pub owner_load: f64,
    /// Cores the owner's work leaves idle.
    pub idle_cpu: f64,
    /// Seconds since the keyboard or mouse was last used (`None`: not measurable here).
    pub input_idle_s: Option<f64>,
    /// The policy's `active_file` exists.
    pub active_file: bool,
}

/// Why the grid may not use the host now (empty: it may), one reason per condition broken.
pub fn owner_reasons(p: &Policy, o: &Observation) -> Vec<String> {
    let mut why = Vec::new();
    if o.active_file {
        why.push(format!(
            "{} exists",
            p.active_file.as_deref().unwrap_or("the owner-active file")
        ));
    }
    if let Some(m) = p.max_load {
        if o.owner_load > m {
            why.push(format!("the owner's load is {:.2} > {m}", o.owner_load));
        }
    }
    if let Some(m) = p.min_idle_cpu {
        if o.idle_cpu < m {
            why.push(format!("{:.2} idle cores < {m}", o.idle_cpu));
        }
    }
    if let (Some(m), Some(i)) = (p.input_idle_s, o.input_idle_s) {
        if i < m {
            why.push(format!(
                "keyboard or mouse used {i:.0} s ago (< {m} s idle)"
            ));
        }
    }
    if !p.in_hours(o.weekday, o.minute) {
        why.push(format!(
            "{} {:02}:{:02} is outside the allowed hours",
            DAY_NAMES[(o.weekday % 7) as usize],
            o.minute / 60,
            o.minute % 60
        ));
    }
    why
}

/// The owner-policy state of a host over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tracker {
    /// The decision.
    pub state: OwnerState,
    /// When the owner's current activity began (ms), for `suspend` and `vacate`.
    pub since_ms: i64,
}

/// The next state, given whether the owner is active (`busy`) at `now_ms`: available while
/// the owner is away; on activity `suspend`, then `vacate` once the activity has lasted
/// `grace_ms`; available again as soon as the owner is away (a vacated host takes new work).
/// Time going backwards counts as no time passing.
pub fn step(p: &Policy, t: Tracker, busy: bool, now_ms: i64) -> Tracker {
    if !busy {
        return Tracker::default();
    }
    match t.state {
        OwnerState::Available => Tracker {
            state: OwnerState::Suspend,
            since_ms: now_ms,
        },
        OwnerState::Suspend if now_ms.saturating_sub(t.since_ms) >= p.grace_ms => Tracker {
            state: OwnerState::Vacate,
            since_ms: t.since_ms,
        },
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn obs() -> Observation {
        Observation {
            weekday: 2,
            minute: 20 * 60,
            owner_load: 0.1,
            idle_cpu: 3.0,
            input_idle_s: None,
            active_file: false,
        }
    }

    #[test]
    fn the_documented_example_parses() {
        let doc = include_str!("policy.rs");
        let start = doc.find("//! ```toml\n").unwrap() + "//! ```toml\n".len();
        let end = start + doc[start..].find("//! ```").unwrap();
        let text: String = doc[start..end]
            .lines()
            .map(|l| l.trim_start_matches("//!").trim_start())
            .collect::<Vec<_>>()
            .join("\n");
        let p = Policy::parse(&text).unwrap();
        assert_eq!(p.max_load, Some(1.5));
        assert_eq!(p.hours, Some((18 * 60, 8 * 60)));
        assert_eq!(p.days, 0b0011111);
        assert_eq!(p.all_day, 0b1100000);
        assert_eq!(p.grace_ms, 60_000);
        assert_eq!(p.active_file.as_deref(), Some("/run/mutirao/owner-active"));
        assert_eq!(Policy::parse("").unwrap(), Policy::default());
    }

    #[test]
    fn bad_policies_say_which_key_and_why() {
        for (text, want) in [
            ("hours = \"18-8\"", "expected \"HH:MM-HH:MM\""),
            ("hours = \"25:00-08:00\"", "expected \"HH:MM-HH:MM\""),
            ("hours = \"08:00-08:00\"", "empty window"),
            ("hours = \"18:00-08:00\"\ndays = [\"someday\"]", "not a day"),
            ("days = [\"mon\"]", "days without hours"),
            ("max_load = -1", "max_load = -1"),
            ("grace_s = nan", "grace_s"),
            ("max_lod = 1", "unknown field"),
            ("max_load = \"high\"", "max_load"),
        ] {
            let e = Policy::parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn hour_windows_cross_midnight_and_belong_to_the_day_they_start() {
        let p = Policy::parse(
            "hours = \"18:00-08:00\"\ndays = [\"mon\",\"tue\",\"wed\",\"thu\",\"fri\"]",
        )
        .unwrap();
        let (mon, fri, sat, sun) = (0, 4, 5, 6);
        assert!(!p.in_hours(mon, 12 * 60));
        assert!(p.in_hours(mon, 18 * 60));
        assert!(p.in_hours(mon, 23 * 60 + 59));
        assert!(
            !p.in_hours(mon, 7 * 60 + 59),
            "Sunday's night is not allowed"
        );
        assert!(
            p.in_hours(1, 7 * 60 + 59),
            "Monday's night runs into Tuesday"
        );
        assert!(!p.in_hours(1, 8 * 60), "the end is exclusive");
        assert!(p.in_hours(sat, 3 * 60), "Friday's night runs into Saturday");
        assert!(!p.in_hours(sat, 20 * 60));
        assert!(!p.in_hours(sun, 3 * 60));
        assert!(p.in_hours(fri, 22 * 60));
        // A window within one day.
        let p = Policy::parse("hours = \"09:30-17:00\"").unwrap();
        assert!(p.in_hours(3, 9 * 60 + 30) && p.in_hours(3, 16 * 60 + 59));
        assert!(!p.in_hours(3, 9 * 60 + 29) && !p.in_hours(3, 17 * 60));
        // Whole days besides the window; a window to midnight.
        let p = Policy::parse("hours = \"22:00-24:00\"\nall_day = [\"sun\"]").unwrap();
        assert!(p.in_hours(sun, 12 * 60) && p.in_hours(mon, 23 * 60));
        assert!(!p.in_hours(mon, 0) && !p.in_hours(mon, 21 * 60 + 59));
        assert!(Policy::default().in_hours(sat, 0));
    }

    #[test]
    fn each_broken_condition_is_a_reason() {
        let p = Policy::parse(
            "max_load = 0.5\nmin_idle_cpu = 1\ninput_idle_s = 60\nhours = \"18:00-08:00\"\nactive_file = \"/tmp/x\"",
        )
        .unwrap();
        assert!(owner_reasons(&p, &obs()).is_empty());
        let busy = Observation {
            owner_load: 0.9,
            idle_cpu: 0.5,
            input_idle_s: Some(5.0),
            minute: 12 * 60,
            active_file: true,
            ..obs()
        };
        let why = owner_reasons(&p, &busy);
        assert_eq!(why.len(), 5, "{why:?}");
        assert!(why[0].contains("/tmp/x exists"));
        assert!(why[1].contains("load is 0.90 > 0.5"));
        assert!(why[3].contains("keyboard"));
        assert!(why[4].contains("wed 12:00 is outside"));
        // Input idle time not measurable on this host: that condition is not applied.
        let unknown = Observation {
            input_idle_s: None,
            ..obs()
        };
        assert!(owner_reasons(&p, &unknown).is_empty());
    }

    #[test]
    fn suspend_then_vacate_after_the_grace_period_and_back() {
        let p = Policy::parse("grace_s = 10").unwrap();
        let t = step(&p, Tracker::default(), false, 0);
        assert_eq!(t.state, OwnerState::Available);
        let t = step(&p, t, true, 1000);
        assert_eq!(
            t,
            Tracker {
                state: OwnerState::Suspend,
                since_ms: 1000
            }
        );
        let t = step(&p, t, true, 10_999);
        assert_eq!(t.state, OwnerState::Suspend);
        let t = step(&p, t, true, 11_000);
        assert_eq!(t.state, OwnerState::Vacate);
        let t = step(&p, t, true, 50_000);
        assert_eq!(t.state, OwnerState::Vacate);
        assert_eq!(step(&p, t, false, 50_001).state, OwnerState::Available);
        // The owner leaving within the grace period: available again, the clock reset.
        let t = step(&p, Tracker::default(), true, 0);
        let t = step(&p, t, false, 5000);
        let t = step(&p, t, true, 9000);
        assert_eq!(
            t,
            Tracker {
                state: OwnerState::Suspend,
                since_ms: 9000
            }
        );
        // Grace 0: still one step of suspend first.
        let p0 = Policy::parse("grace_s = 0").unwrap();
        let t = step(&p0, Tracker::default(), true, 7);
        assert_eq!(t.state, OwnerState::Suspend);
        assert_eq!(step(&p0, t, true, 7).state, OwnerState::Vacate);
    }

    proptest! {
        /// Whatever the owner does and however the clock moves (even backwards), a host never
        /// goes from available to vacate without being suspended for the whole grace period
        /// on the way, and every vacate follows an unbroken run of suspend.
        #[test]
        fn never_vacate_without_suspend_for_the_grace_period(
            grace_s in 0u32..100,
            steps in proptest::collection::vec((any::<bool>(), -5_000i64..40_000), 1..200),
        ) {
            let p = Policy::parse(&format!("grace_s = {grace_s}")).unwrap();
            let mut t = Tracker::default();
            let mut now = 0i64;
            let mut suspended_at: Option<i64> = None;
            for (busy, dt) in steps {
                now += dt;
                let prev = t.state;
                t = step(&p, t, busy, now);
                match t.state {
                    OwnerState::Available => suspended_at = None,
                    OwnerState::Suspend => {
                        prop_assert_ne!(prev, OwnerState::Vacate);
                        if prev == OwnerState::Available {
                            suspended_at = Some(now);
                        }
                    }
                    OwnerState::Vacate => {
                        prop_assert_ne!(prev, OwnerState::Available);
                        let s = suspended_at.expect("vacate without a suspend before it");
                        // Checked when the host becomes vacate (a clock that goes back later
                        // does not undo a vacate).
                        if prev == OwnerState::Suspend {
                            prop_assert!(now - s >= p.grace_ms, "vacated {} ms after suspend, grace {}", now - s, p.grace_ms);
                        }
                    }
                }
            }
        }
    }
}
