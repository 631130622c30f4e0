//! SVG Gantt chart of a simulated schedule: one row per host, tasks in blue, send overheads
//! in orange, receive overheads in green, with a time axis in seconds.

use crate::dag::Dag;
use crate::platform::Platform;
use crate::sim::{Placement, SimResult};
use std::fmt::Write as _;

const ROW_H: f64 = 28.0;
const LEFT: f64 = 160.0;
const TOP: f64 = 30.0;
const WIDTH: f64 = 1000.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Render `result` (from [`crate::sim::simulate`] with the same `dag`, `platform` and
/// `placement`) as a self-contained SVG document. Each rectangle has a `<title>` with its
/// task id or message and exact times, so a browser shows them on hover.
pub fn gantt_svg(
    dag: &Dag,
    platform: &Platform,
    placement: &Placement,
    result: &SimResult,
) -> String {
    let span = if result.makespan_s > 0.0 {
        result.makespan_s
    } else {
        1.0
    };
    let x = |t: f64| LEFT + (t.max(0.0) / span) * WIDTH;
    let np = platform.len();
    let height = TOP + ROW_H * np as f64 + 40.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11">"#,
        LEFT + WIDTH + 20.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="16">makespan {:.6} s</text>"#,
        result.makespan_s
    );
    for (h, host) in platform.hosts().iter().enumerate() {
        let y = TOP + ROW_H * h as f64;
        let _ = writeln!(
            s,
            r##"<text x="4" y="{}">{}</text><line x1="{LEFT}" y1="{}" x2="{}" y2="{}" stroke="#ccc"/>"##,
            y + ROW_H * 0.6,
            esc(&host.name),
            y + ROW_H,
            LEFT + WIDTH,
            y + ROW_H
        );
    }
    let rect = |s: &mut String, h: usize, a: f64, b: f64, fill: &str, title: &str, inset: f64| {
        let y = TOP + ROW_H * h as f64 + inset;
        let w = (x(b) - x(a)).max(0.5);
        let _ = writeln!(
            s,
            r#"<rect x="{:.2}" y="{y:.2}" width="{w:.2}" height="{:.2}" fill="{fill}" stroke="black" stroke-width="0.3"><title>{}</title></rect>"#,
            x(a),
            ROW_H - 2.0 * inset,
            esc(title)
        );
    };
    for (t, tt) in result.tasks.iter().enumerate() {
        let title = format!(
            "{} on {}: {:.6} – {:.6} s",
            dag.tasks()[t].id,
            platform.hosts()[placement.host[t]].name,
            tt.start_s,
            tt.finish_s
        );
        rect(
            &mut s,
            placement.host[t],
            tt.start_s,
            tt.finish_s,
            "#6fa8dc",
            &title,
            3.0,
        );
    }
    for m in &result.messages {
        let e = dag.edges()[m.edge];
        let what = format!(
            "{} -> {} ({} B)",
            dag.tasks()[e.from].id,
            dag.tasks()[e.to].id,
            e.bytes
        );
        if m.send_end_s > m.send_start_s {
            let title = format!("Os {what}: {:.6} – {:.6} s", m.send_start_s, m.send_end_s);
            rect(
                &mut s,
                m.src_host,
                m.send_start_s,
                m.send_end_s,
                "#f6b26b",
                &title,
                6.0,
            );
        }
        if m.recv_end_s > m.recv_start_s {
            let title = format!("Or {what}: {:.6} – {:.6} s", m.recv_start_s, m.recv_end_s);
            rect(
                &mut s,
                m.dst_host,
                m.recv_start_s,
                m.recv_end_s,
                "#93c47d",
                &title,
                6.0,
            );
        }
    }
    let axis_y = TOP + ROW_H * np as f64 + 14.0;
    for i in 0..=10 {
        let t = span * i as f64 / 10.0;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{axis_y}" text-anchor="middle">{t:.3}</text>"#,
            x(t)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{}">time (s); blue: task, orange: send overhead Os, green: receive overhead Or</text>"#,
        axis_y + 16.0
    );
    s.push_str("</svg>\n");
    s
}
