//! Golden tests: the thesis's Fig. 4.1 host list and Fig. 4.2 output, exactly as printed
//! (digest 000 §1.3, §1.4), parse and round-trip.

use mutirao_model::calib::{
    CalibHost, Calibration, Inheritance, PairRef, PingPongSample, SendMode, SpeedMeasurement,
    SpeedSample, StrategyKind,
};
use mutirao_model::legacy::{
    infer_site, output_from_calibration, parse_host_list, parse_output, write_host_list,
    write_output, CommaStyle,
};

const FIG_4_1: &str = "siriguela.ic.uff.br
melancia.ic.uff.br
n01.par.inf.puc-rio.br /home/local/gridriouser/helder
caju.ic.uff.br
";

const FIG_4_2: &str = "4
298 caju.ic.uff.br 28 3 linux
323 siriguela.ic.uff.br 27 5 linux
426 melancia.ic.uff.br 45 6 linux
250 n01.par.inf.puc-rio.br 25 4 linux /home/local/gridriouser/helder
0      234      238      23,567
246    0        226      25,432
230    246      0        24,126
27,036 26,223 23,677 0
";

#[test]
fn fig_4_1_parses_and_round_trips_exactly() {
    let hosts = parse_host_list(FIG_4_1).unwrap();
    assert_eq!(hosts.len(), 4);
    let with_path: Vec<&str> = hosts
        .iter()
        .filter(|h| h.exec_path.is_some())
        .map(|h| h.name.as_str())
        .collect();
    assert_eq!(with_path, ["n01.par.inf.puc-rio.br"]);
    assert_eq!(
        hosts[2].exec_path.as_deref(),
        Some("/home/local/gridriouser/helder")
    );
    assert_eq!(write_host_list(&hosts), FIG_4_1);
    // Sites from the domain, or from a map, or explicit.
    assert_eq!(infer_site(&hosts[0], &[]), "ic.uff.br");
    assert_eq!(infer_site(&hosts[2], &[]), "par.inf.puc-rio.br");
    let map = [("uff.br".to_string(), "UFF".to_string())];
    assert_eq!(infer_site(&hosts[3], &map), "UFF");
}

#[test]
fn host_list_extensions_and_errors() {
    let text = "# grid\n\na1 site=a   # first\na2 /opt/x site=a\n";
    let hosts = parse_host_list(text).unwrap();
    assert_eq!(hosts.len(), 2);
    assert_eq!(hosts[1].site.as_deref(), Some("a"));
    assert_eq!(infer_site(&hosts[0], &[]), "a");
    assert_eq!(parse_host_list(&write_host_list(&hosts)).unwrap(), hosts);
    let e = parse_host_list("a1\na1\n").unwrap_err();
    assert_eq!((e.line, e.col), (2, 1));
    let e = parse_host_list("a1 /p /q\n").unwrap_err();
    assert_eq!((e.line, e.col), (1, 7));
}

#[test]
fn fig_4_2_parses_as_printed() {
    let (out, warnings) = parse_output(FIG_4_2, CommaStyle::Thousands).unwrap();
    assert_eq!(out.hosts.len(), 4);
    let col = |f: fn(&mutirao_model::legacy::LegacyOutHost) -> f64| -> Vec<f64> {
        out.hosts.iter().map(f).collect()
    };
    assert_eq!(col(|h| h.h), [298.0, 323.0, 426.0, 250.0]);
    assert_eq!(col(|h| h.os), [28.0, 27.0, 45.0, 25.0]);
    assert_eq!(col(|h| h.or), [3.0, 5.0, 6.0, 4.0]);
    assert!(out.hosts.iter().all(|h| h.system == "linux"));
    assert_eq!(
        out.hosts[3].exec_path.as_deref(),
        Some("/home/local/gridriouser/helder")
    );
    assert!(out.hosts[..3].iter().all(|h| h.exec_path.is_none()));
    assert_eq!(out.latency.len(), 4);
    for (i, row) in out.latency.iter().enumerate() {
        assert_eq!(row.len(), 4);
        assert_eq!(row[i], 0.0);
    }
    assert_eq!(out.latency[0], [0.0, 234.0, 238.0, 23567.0]);
    assert_eq!(out.latency[3], [27036.0, 26223.0, 23677.0, 0.0]);
    // Not symmetric.
    assert_ne!(out.latency[0][1], out.latency[1][0]);
    // Every comma reading is reported, with its place.
    assert_eq!(warnings.len(), 6);
    assert!(
        warnings[0].starts_with("line 6, column 26: \"23,567\" read as 23567"),
        "{}",
        warnings[0]
    );
    // The decimal reading is available.
    let (dec, _) = parse_output(FIG_4_2, CommaStyle::Decimal).unwrap();
    assert_eq!(dec.latency[0][3], 23.567);
}

#[test]
fn fig_4_2_round_trips() {
    let (out, _) = parse_output(FIG_4_2, CommaStyle::Thousands).unwrap();
    let text = write_output(&out, Some("size 65536 B, mode isend"));
    // Host lines come back exactly as printed; the matrix whitespace is normalised.
    let printed: Vec<&str> = FIG_4_2.lines().take(5).collect();
    let written: Vec<&str> = text.lines().take(5).collect();
    assert_eq!(written, printed);
    assert_eq!(text.lines().nth(5), Some("0 234 238 23567"));
    assert_eq!(text.lines().last(), Some("# size 65536 B, mode isend"));
    let (back, warnings) = parse_output(&text, CommaStyle::Thousands).unwrap();
    assert!(warnings.is_empty());
    assert_eq!(back, out);
    assert_eq!(write_output(&back, Some("size 65536 B, mode isend")), text);
}

#[test]
fn malformed_output_names_line_and_column() {
    let e = parse_output("2\n1 a 1 1 linux\n", CommaStyle::Thousands).unwrap_err();
    assert!(e.to_string().contains("1 of 2 host lines"), "{e}");
    let e = parse_output("1\n1 a 1 1 linux\n0 5\n", CommaStyle::Thousands).unwrap_err();
    assert_eq!(e.line, 3);
    let e = parse_output("1\n1 a x 1 linux\n0\n", CommaStyle::Thousands).unwrap_err();
    assert_eq!((e.line, e.col), (2, 5));
    let e = parse_output("1\n1 a 1 1 linux\n2,5\n", CommaStyle::Thousands).unwrap_err();
    assert_eq!((e.line, e.col), (3, 1));
    let e = parse_output("1\n1 a 1 1 linux\n0\n7\n", CommaStyle::Thousands).unwrap_err();
    assert_eq!(e.line, 4);
}

fn pp(l: f64, os: f64, or: f64) -> PingPongSample {
    PingPongSample {
        rtt_us: 2.0 * l + 2.0 * os + 2.0 * or,
        os_src_us: os,
        or_dst_us: or,
        os_dst_us: os,
        or_src_us: or,
        probe_us: None,
        wait_src_us: None,
    }
}

#[test]
fn calibration_to_fig_4_2() {
    let mut c = Calibration::new(StrategyKind::SiteSampled, "test", 0);
    for (n, s, h) in [("a1", "a", 100.0), ("a2", "a", 200.0), ("b1", "b", 300.0)] {
        let mut host = CalibHost::new(n, s, "x");
        host.os = Some("linux".into());
        host.speed = Some(SpeedMeasurement {
            kernel: "k".into(),
            reps: 10,
            samples: vec![SpeedSample {
                wall_us: h * 10.0,
                cpu_us: h * 10.0,
            }],
        });
        c.add_host(host).unwrap();
    }
    c.record_pingpong(
        "a1",
        "a2",
        SendMode::Isend,
        1024,
        0,
        &[pp(100.0, 10.0, 2.0)],
    )
    .unwrap();
    c.record_pingpong(
        "a1",
        "b1",
        SendMode::Isend,
        1024,
        0,
        &[pp(5000.0, 20.0, 4.0)],
    )
    .unwrap();
    c.record_pingpong(
        "b1",
        "a1",
        SendMode::Isend,
        1024,
        0,
        &[pp(6000.0, 30.0, 6.0)],
    )
    .unwrap();
    for (p, f) in [
        (("a2", "a1"), ("a1", "a2")),
        (("a2", "b1"), ("a1", "b1")),
        (("b1", "a2"), ("b1", "a1")),
    ] {
        c.provenance.inherited.push(Inheritance {
            pair: PairRef::new(p.0, p.1),
            from: PairRef::new(f.0, f.1),
        });
    }
    c.finalize(1);
    let out = output_from_calibration(&c, 1024, SendMode::Isend).unwrap();
    assert_eq!(out.hosts[0].h, 100.0);
    assert_eq!(out.hosts[0].os, 15.0); // mean of 10 (to a2) and 20 (to b1)
    assert_eq!(out.hosts[2].or, 4.0); // from a1 and (inherited) a2
    assert_eq!(out.latency[0], [0.0, 100.0, 5000.0]);
    assert_eq!(out.latency[2], [6000.0, 6000.0, 0.0]);
    let text = write_output(&out, None);
    assert!(text.starts_with("3\n100 a1 15 "), "{text}");
    assert_eq!(parse_output(&text, CommaStyle::Thousands).unwrap().0, out);
    let e = output_from_calibration(&c, 2048, SendMode::Isend).unwrap_err();
    assert!(e.to_string().contains("no samples at 2048 B"), "{e}");
}
