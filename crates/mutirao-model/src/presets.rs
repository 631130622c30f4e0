//! Built-in models transcribed from the HLogP thesis (Mendes, UFF 2004), for regression tests
//! and examples.
//!
//! * [`gridrio2004`]: the GridRio grid as the thesis's analytic MPICH-G2 model describes it
//!   (thesis §4.4.3, Figs. 4.11–4.13, Tables 4.30–4.32): three sites (`UFF`, `Sinergia`, `PUC`),
//!   the ten hosts whose communication was calibrated (Table 4.1), one equation set per site and
//!   per site pair. It is a valid `mutirao-model/1` model.
//! * [`gridrio2004_lam`]: the analytic MPI-LAM `MPI_Send` equations (thesis §5.2, Tables
//!   5.6–5.9). They contain negative latencies (send and receive overlap), which the
//!   `mutirao-model/1` validator rejects, so they are returned as bare [`LinkParams`].
//!
//! ## How the equations become piecewise linear functions
//! The format's functions are piecewise linear (`base_us + per_byte_us·(m − from)`).
//! * Linear pieces `s·(m − x0) + y0` are transcribed exactly (as `from` = the piece's first
//!   size, `base_us` = the value there).
//! * Quadratic pieces `a·m² + b·m + c` (the receive overheads below 64 KiB) become chords over
//!   1024-byte segments: exact at every multiple of 1024 bytes, off by at most `a·512²`
//!   (< 0.005 µs for every equation here).
//!
//! ## Choices the thesis leaves open (documented, not invented silently)
//! * **Speeds** come from Table 4.13 (version II H, unloaded hosts): `speed = 26 / H`, so the
//!   2.6 GHz Pentium IVs have speed 1.0, jenipapo and the PUC hosts 0.65, caju 26/42.
//! * **UFF `Os`** uses the slope printed in Fig. 4.12 (0.0001 µs/B; Table 4.34's column fits
//!   0.00006, see digest §9 item 2) and switches to 37 µs at exactly 131072 bytes.
//! * **Same host**: §4.4.3 fits no same-host equations. `Os` and `Or` reuse the UFF equations
//!   (local library costs); `L` follows the MPICH-G2 busy-polling artefact of Table 4.15
//!   (Isend, same host): 99,970 µs up to 256 KiB, then the line through its 256 KiB
//!   (299,612 µs) and 4 MiB (4,782,963 µs) values.
//! * **Sinergia–PUC** uses the UFF–PUC row, as Table 4.32 prints it.

use crate::{Host, Link, LinkClass, LinkParams, Model, Piecewise, Segment};

/// Site names used by the presets.
pub const SITES: [&str; 3] = ["UFF", "Sinergia", "PUC"];

const CHORD: u64 = 1024;

fn seg(from: u64, base_us: f64, per_byte_us: f64) -> Segment {
    Segment {
        from,
        base_us,
        per_byte_us,
    }
}

/// `slope·(m − x0) + y0` for all m, as one segment from 0.
fn line(slope: f64, x0: f64, y0: f64) -> Vec<Segment> {
    vec![seg(0, y0 - slope * x0, slope)]
}

/// Chords of `a·m² + b·m + c` over `[0, upto)` in 1024-byte steps.
fn quad(a: f64, b: f64, c: f64, upto: u64) -> Vec<Segment> {
    let f = |m: u64| {
        let m = m as f64;
        a * m * m + b * m + c
    };
    (0..upto / CHORD)
        .map(|i| {
            let x = i * CHORD;
            seg(x, f(x), (f(x + CHORD) - f(x)) / CHORD as f64)
        })
        .collect()
}

fn then(mut head: Vec<Segment>, from: u64, base_us: f64, per_byte_us: f64) -> Piecewise {
    head.retain(|s| s.from < from);
    head.push(seg(from, base_us, per_byte_us));
    Piecewise(head)
}

/// One row of Tables 4.30–4.32: `L = l_slope·(m − 64) + l_base`;
/// `Os = os_slope·(m − 64) + os_base` below 131072 B, `os_const` from there;
/// `Or = or_a·m² + 1.023e−3·m + or_c` below 65536 B, `or_slope·(m − 65536) + or_base` from there.
struct MpichRow {
    l_slope: f64,
    l_base: f64,
    os_slope: f64,
    os_base: f64,
    os_const: f64,
    or_a: f64,
    or_c: f64,
    or_slope: f64,
    or_base: f64,
}

impl MpichRow {
    fn params(&self) -> LinkParams {
        LinkParams {
            l: Piecewise(line(self.l_slope, 64.0, self.l_base)),
            os: then(
                line(self.os_slope, 64.0, self.os_base),
                131_072,
                self.os_const,
                0.0,
            ),
            or: then(
                quad(self.or_a, 1.023e-3, self.or_c, 65_536),
                65_536,
                self.or_base,
                self.or_slope,
            ),
        }
    }
}

const UFF: MpichRow = MpichRow {
    l_slope: 0.0865,
    l_base: 314.0,
    os_slope: 0.0001,
    os_base: 14.0,
    os_const: 37.0,
    or_a: 4.637e-9,
    or_c: 1.9829,
    or_slope: 0.00165,
    or_base: 86.0,
};
const PUC: MpichRow = MpichRow {
    l_slope: 0.0860,
    l_base: 192.0,
    os_slope: 0.0003,
    os_base: 17.0,
    os_const: 56.0,
    or_a: 1.0434e-8,
    or_c: 3.9829,
    or_slope: 0.00293,
    or_base: 152.0,
};
const SINERGIA: MpichRow = MpichRow {
    l_slope: 0.0116,
    l_base: 230.0,
    os_slope: 0.00005,
    os_base: 11.0,
    os_const: 32.0,
    or_a: 4.637e-9,
    or_c: 2.9829,
    or_slope: 0.00185,
    or_base: 93.0,
};
const UFF_SINERGIA: MpichRow = MpichRow {
    l_slope: 1.1337,
    l_base: 1123.0,
    os_slope: 0.0001,
    os_base: 13.0,
    os_const: 31.0,
    or_a: 1.159e-8,
    or_c: 2.9829,
    or_slope: 0.00200,
    or_base: 111.0,
};
const UFF_PUC: MpichRow = MpichRow {
    l_slope: 1.6275,
    l_base: 4680.0,
    os_slope: 0.000046,
    os_base: 15.0,
    os_const: 33.0,
    or_a: 1.739e-8,
    or_c: 4.9829,
    or_slope: 0.00304,
    or_base: 131.0,
};

fn link(class: LinkClass, site: Option<&str>, sites: Option<[&str; 2]>, p: LinkParams) -> Link {
    Link {
        class,
        site: site.map(str::to_string),
        sites: sites.map(|[a, b]| [a.to_string(), b.to_string()]),
        src: None,
        dst: None,
        os: p.os,
        or: p.or,
        l: p.l,
    }
}

/// The analytic MPICH-G2 equations of one site (`"UFF"`, `"Sinergia"`, `"PUC"`) or site pair
/// (either order), in µs, exactly as [`gridrio2004`] uses them.
pub fn gridrio2004_link(site_a: &str, site_b: &str) -> Option<LinkParams> {
    let row = match (site_a, site_b) {
        ("UFF", "UFF") => &UFF,
        ("PUC", "PUC") => &PUC,
        ("Sinergia", "Sinergia") => &SINERGIA,
        ("UFF", "Sinergia") | ("Sinergia", "UFF") => &UFF_SINERGIA,
        ("UFF", "PUC") | ("PUC", "UFF") | ("Sinergia", "PUC") | ("PUC", "Sinergia") => &UFF_PUC,
        _ => return None,
    };
    Some(row.params())
}

/// The same-host link of [`gridrio2004`] (see the module docs for its provenance).
pub fn gridrio2004_same_host() -> LinkParams {
    let uff = UFF.params();
    let slope = (4_782_963.0 - 299_612.0) / (4_194_304.0 - 262_144.0);
    LinkParams {
        os: uff.os,
        or: uff.or,
        l: Piecewise(vec![seg(0, 99_970.0, 0.0), seg(262_144, 299_612.0, slope)]),
    }
}

/// The hosts of [`gridrio2004`]: `(name, site, H)` from Tables 4.1 and 4.13.
pub const GRIDRIO2004_HOSTS: [(&str, &str, f64); 10] = [
    ("sn02.ic.uff.br", "UFF", 26.0),
    ("sn04.ic.uff.br", "UFF", 26.0),
    ("jenipapo.ic.uff.br", "UFF", 40.0),
    ("caju.ic.uff.br", "UFF", 42.0),
    ("sn16.ic.uff.br", "Sinergia", 26.0),
    ("sn17.ic.uff.br", "Sinergia", 26.0),
    ("n19.par.inf.puc-rio.br", "PUC", 40.0),
    ("n20.par.inf.puc-rio.br", "PUC", 40.0),
    ("n21.par.inf.puc-rio.br", "PUC", 40.0),
    ("n22.par.inf.puc-rio.br", "PUC", 40.0),
];

/// The `gridrio2004` preset: GridRio under the thesis's analytic MPICH-G2 model.
pub fn gridrio2004() -> Model {
    let hosts = GRIDRIO2004_HOSTS
        .iter()
        .map(|&(name, site, h)| Host {
            name: name.to_string(),
            site: site.to_string(),
            speed: 26.0 / h,
            addr: None,
        })
        .collect();
    let mut links = vec![link(
        LinkClass::SameHost,
        None,
        None,
        gridrio2004_same_host(),
    )];
    for s in SITES {
        if let Some(p) = gridrio2004_link(s, s) {
            links.push(link(LinkClass::IntraSite, Some(s), None, p));
        }
    }
    for (a, b) in [("UFF", "Sinergia"), ("UFF", "PUC"), ("Sinergia", "PUC")] {
        if let Some(p) = gridrio2004_link(a, b) {
            links.push(link(LinkClass::InterSite, None, Some([a, b]), p));
        }
    }
    Model {
        format: crate::MODEL_FORMAT.to_string(),
        hosts,
        links,
        capacity: None,
        poor_fit: Vec::new(),
        eager_limit_bytes: None,
        push_cost: Vec::new(),
    }
}

/// Which MPI-LAM equation set of [`gridrio2004_lam`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LamClass {
    /// Within site UFF (L and Or from thesis §5.2; Os above 64 KiB from Table 5.9).
    Uff,
    /// Within site Sinergia (Tables 5.6–5.8).
    Sinergia,
    /// Between UFF and Sinergia (Tables 5.6–5.8; the Os intercept +97 and Or slope 1.50795
    /// of Table 5.9).
    UffSinergia,
    /// Same host: L of Table 5.6 (0 above 64 KiB, the adjusted model); Os = Or = the
    /// Table 5.8 row labelled "mesmo site" (the adjusted model sets Os = Or).
    SameHost,
}

fn lam(
    l: (f64, f64, f64, f64),
    os: (f64, f64, f64, f64, f64),
    or: (f64, f64, f64, f64, f64),
) -> LinkParams {
    const B: u64 = 65_536;
    LinkParams {
        l: then(line(l.0, 64.0, l.1), B, l.3, l.2),
        os: then(quad(os.0, os.1, os.2, B), B, os.4, os.3),
        or: then(quad(or.0, or.1, or.2, B), B, or.4, or.3),
    }
}

/// The analytic MPI-LAM `MPI_Send` equations (µs). Tuples are
/// `L: (slope below 64 KiB, value at 64 B, slope above, value at 64 KiB)` and
/// `Os/Or: (a, b, c of a·m² + b·m + c below 64 KiB, slope above, value at 64 KiB)`.
/// Values may be negative (digest 000 §4.2): use them with a platform that allows it, never
/// as a model file.
pub fn gridrio2004_lam(class: LamClass) -> LinkParams {
    match class {
        LamClass::Uff => lam(
            (0.0940, 115.0, -0.085, -410.0),
            (1.159e-8, 1.705e-3, 9.0, 0.0847, 138.0),
            (5.217e-9, 1.023e-3, 2.0, 0.0849, 6006.0),
        ),
        LamClass::Sinergia => lam(
            (0.0110, 100.0, 0.0110, -605.0),
            (5.8e-10, 1.705e-3, 7.0, 0.0096, -123.0),
            (5.217e-9, 1.006e-3, 2.0, 0.00961, 1000.0),
        ),
        LamClass::UffSinergia => lam(
            (1.0844, 100.0, -1.369, -664.0),
            (1.1593e-8, 1.705e-3, 9.0, 1.508, 97.0),
            (1.159e-8, 6.479e-4, 2.0, 1.50795, 73_415.0),
        ),
        LamClass::SameHost => lam(
            (0.0022, 24.0, 0.0, 0.0),
            (1.4492e-8, 6.479e-4, 2.0, 0.00255, 300.0),
            (1.4492e-8, 6.479e-4, 2.0, 0.00255, 300.0),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64, tol: f64, what: &str) {
        assert!(
            (got - want).abs() <= tol,
            "{what}: got {got}, want {want} ± {tol}"
        );
    }

    #[test]
    fn preset_is_a_valid_complete_model() {
        let m = gridrio2004();
        m.validate().unwrap();
        m.check_complete().unwrap();
        assert_eq!(m.hosts.len(), 10);
        // JSON text round-trips (floats to within printing precision).
        let back = Model::from_json(&m.to_json()).unwrap();
        assert_eq!(back.hosts, m.hosts);
        for (a, b) in m
            .hosts
            .iter()
            .flat_map(|a| m.hosts.iter().map(move |b| (a, b)))
        {
            let (x, y) = (
                m.link_params(&a.name, &b.name).unwrap(),
                back.link_params(&a.name, &b.name).unwrap(),
            );
            for bytes in [0u64, 100, 5000, 65_536, 1 << 22] {
                close(x.or.value(bytes), y.or.value(bytes), 1e-9, "Or after JSON");
                close(x.l.value(bytes), y.l.value(bytes), 1e-9, "L after JSON");
            }
        }
    }

    // Digest 000 §11.8 item 2 (±1 µs).
    #[test]
    fn item2_preset_equations() {
        let m = gridrio2004();
        let uff = m.link_params("sn02.ic.uff.br", "sn04.ic.uff.br").unwrap();
        let uff_puc = m
            .link_params("sn02.ic.uff.br", "n19.par.inf.puc-rio.br")
            .unwrap();
        close(uff.l.value(64), 314.0, 1.0, "UFF L(64)");
        close(uff.l.value(65_536), 5977.0, 1.0, "UFF L(65536)");
        close(uff.l.value(2_097_152), 181_712.0, 1.0, "UFF L(2097152)");
        close(
            uff_puc.l.value(2_097_152),
            3_417_691.0,
            1.0,
            "UFF-PUC L(2097152)",
        );
        close(uff.or.value(65_536), 86.0, 1.0, "UFF Or(65536)");
        close(uff.or.value(2_097_152), 3438.0, 1.0, "UFF Or(2097152)");
        close(
            uff_puc.or.value(2_097_152),
            6307.0,
            1.0,
            "UFF-PUC Or(2097152)",
        );
        close(uff.os.value(262_144), 37.0, 1.0, "UFF Os(262144)");
        // The PUC -> UFF direction uses the same row.
        let puc_uff = m
            .link_params("n20.par.inf.puc-rio.br", "caju.ic.uff.br")
            .unwrap();
        assert_eq!(puc_uff, uff_puc);
    }

    // Table 4.33 "L calculated" (21 sizes) and Table 4.35 "Or calculated" for m >= 65536.
    #[test]
    fn item2_tables_4_33_and_4_35() {
        let uff = gridrio2004_link("UFF", "UFF").unwrap();
        let l_calc: [(u64, f64); 21] = [
            (64, 314.0),
            (128, 320.0),
            (256, 331.0),
            (512, 353.0),
            (1024, 397.0),
            (2048, 486.0),
            (4096, 663.0),
            (8192, 1017.0),
            (16384, 1726.0),
            (32768, 3143.0),
            (65536, 5977.0),
            (131072, 11646.0),
            (262144, 22984.0),
            (524288, 45659.0),
            (1048576, 91010.0),
            (2097152, 181712.0),
            (4194304, 363116.0),
            (8388608, 725923.0),
            (16777216, 1451538.0),
            (33554432, 2902767.0),
            (67108864, 5805225.0),
        ];
        for (m, want) in l_calc {
            close(uff.l.value(m), want, 1.0, &format!("Table 4.33 L({m})"));
        }
        let or_calc: [(u64, f64); 11] = [
            (65536, 86.0),
            (131072, 194.0),
            (262144, 410.0),
            (524288, 843.0),
            (1048576, 1708.0),
            (2097152, 3438.0),
            (4194304, 6898.0),
            (8388608, 13819.0),
            (16777216, 27660.0),
            (33554432, 55343.0),
            (67108864, 110707.0),
        ];
        for (m, want) in or_calc {
            close(uff.or.value(m), want, 1.0, &format!("Table 4.35 Or({m})"));
        }
    }

    #[test]
    fn quadratic_chords_are_exact_on_the_grid_and_close_between() {
        let uff = gridrio2004_link("UFF", "UFF").unwrap();
        let f = |m: f64| 4.637e-9 * m * m + 1.023e-3 * m + 1.9829;
        for m in [0u64, 1024, 4096, 32768, 64512] {
            close(uff.or.value(m), f(m as f64), 1e-9, "chord at a grid point");
        }
        for m in [100u64, 1500, 40_000, 65_535] {
            close(
                uff.or.value(m),
                f(m as f64),
                0.005,
                "chord between grid points",
            );
        }
        // Discontinuity at the 131072 break, as in the thesis (digest §3.5).
        close(
            uff.os.value(131_071),
            0.0001 * (131_071.0 - 64.0) + 14.0,
            1e-9,
            "Os below",
        );
        assert_eq!(uff.os.value(131_072), 37.0);
    }

    // Digest 000 §11.8 item 2, last bullet (Table 5.10 within 0.01%).
    #[test]
    fn item2_lam_uff_sinergia_at_2mb() {
        let p = gridrio2004_lam(LamClass::UffSinergia);
        let m = 2_097_152;
        close(p.os.value(m), 3_063_774.0, 1.0, "LAM UFF-Sinergia Os(2MB)");
        close(p.l.value(m), -2_781_946.0, 1.0, "LAM UFF-Sinergia L(2MB)");
        close(p.or.value(m), 3_136_990.0, 1.0, "LAM UFF-Sinergia Or(2MB)");
        for (got, table) in [
            (p.os.value(m), 3_063_740.0),
            (p.l.value(m), -2_781_950.0),
            (p.or.value(m), 3_136_989.0),
        ] {
            assert!(
                ((got - table) / table).abs() < 1e-4,
                "{got} vs Table 5.10 {table}"
            );
        }
        // Table 5.9's intra-UFF send overhead at 2 MB (Table 5.4 measured 171,673).
        close(
            gridrio2004_lam(LamClass::Uff).os.value(m),
            172_216.0,
            1.0,
            "LAM UFF Os(2MB)",
        );
        assert_eq!(gridrio2004_lam(LamClass::SameHost).l.value(m), 0.0);
    }
}
