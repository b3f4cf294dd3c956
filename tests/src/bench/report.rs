//! The side-by-side report: one table (text for the terminal, markdown for the docs) with ratios
//! to ours, the latency distributions as an SVG plot, and the machine they were measured on.
//! Formatting only; the caller writes the files.

use std::time::Duration;

use super::workload::{percentile, Outcome};

/// One row: a system measured, or skipped with the reason.
pub struct Row {
    pub name: String,
    pub version: String,
    pub result: Result<Outcome, String>,
}

fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e3;
    if v < 10.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn pct(o: &Outcome, p: f64) -> String {
    percentile(&o.latencies, p).map_or("–".into(), ms)
}

fn ratio(o: &Outcome, ours: Option<&Outcome>, p: f64) -> String {
    let (Some(v), Some(base)) = (
        percentile(&o.latencies, p),
        ours.and_then(|b| percentile(&b.latencies, p)),
    ) else {
        return "–".into();
    };
    let r = v.as_secs_f64() / base.as_secs_f64();
    if r >= 10.0 {
        format!("{r:.0}×")
    } else {
        format!("{r:.2}×")
    }
}

fn failed(r: &super::workload::Requests) -> String {
    let total = r.ok + r.failed;
    if total == 0 {
        return "–".into();
    }
    format!("{} / {total}", r.failed)
}

/// Everything a row says beyond the main figures: timeouts, probe failures, a third
/// certificate, reconnects of kept-alive connections, and the probe's resolution.
fn notes(o: &Outcome) -> String {
    let mut notes = Vec::new();
    if o.timed_out > 0 {
        notes.push(format!("{} rotations timed out", o.timed_out));
    }
    if o.probe_failures > 0 {
        notes.push(format!("{} probe handshakes failed", o.probe_failures));
    }
    if o.third_certificate > 0 {
        notes.push(format!(
            "{} handshakes saw another certificate",
            o.third_certificate
        ));
    }
    if o.keep_alive.reconnects > 0 {
        notes.push(format!(
            "{} kept-alive connections closed by the server (retried)",
            o.keep_alive.reconnects
        ));
    }
    if let Some(p) = percentile(&o.probe, 50.0) {
        notes.push(format!("probe handshake {}", ms(p)));
    }
    notes.join("; ")
}

const HEADER: [&str; 10] = [
    "system",
    "version",
    "p50",
    "p99",
    "max",
    "old after switch",
    "failed (new conn)",
    "failed (keep-alive)",
    "p50 ÷ ours",
    "p99 ÷ ours",
];

fn cells(rows: &[Row]) -> Vec<Vec<String>> {
    let ours = rows.first().and_then(|r| r.result.as_ref().ok());
    rows.iter()
        .map(|row| match &row.result {
            Ok(o) => vec![
                row.name.clone(),
                row.version.clone(),
                pct(o, 50.0),
                pct(o, 99.0),
                pct(o, 100.0),
                format!("{} / {}", o.old_after_switch, o.after_handshakes),
                failed(&o.new_conn),
                failed(&o.keep_alive),
                ratio(o, ours, 50.0),
                ratio(o, ours, 99.0),
            ],
            Err(why) => {
                let mut cells = vec![row.name.clone(), row.version.clone()];
                cells.push(format!("skipped: {why}"));
                cells.resize(HEADER.len(), String::new());
                cells
            }
        })
        .collect()
}

/// A plain-text table for the terminal, then one line of notes per measured system.
pub fn text(rows: &[Row]) -> String {
    let cells = cells(rows);
    let mut widths: Vec<usize> = HEADER.iter().map(|h| h.chars().count()).collect();
    for row in &cells {
        for (i, c) in row.iter().enumerate() {
            // A skip reason runs on past its column.
            if !c.starts_with("skipped:") {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let line = |row: &[String]| {
        let mut out = String::new();
        for (i, c) in row.iter().enumerate() {
            out.push_str(&format!("{c:<w$}  ", w = widths[i]));
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(&HEADER.map(String::from));
    for row in &cells {
        out.push_str(&line(row));
    }
    for row in rows {
        if let Ok(o) = &row.result {
            out.push_str(&format!("{}: {}\n", row.name, notes(o)));
            for e in o
                .new_conn
                .first_errors
                .iter()
                .chain(&o.keep_alive.first_errors)
            {
                out.push_str(&format!("  failed request: {e}\n"));
            }
        }
    }
    out
}

/// The same table in markdown, with each system's notes below it.
pub fn markdown(rows: &[Row]) -> String {
    let cells = cells(rows);
    let mut out = format!("| {} |\n", HEADER.join(" | "));
    out.push_str("|---|---|");
    out.push_str(&"---:|".repeat(HEADER.len() - 2));
    out.push('\n');
    for row in &cells {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out.push('\n');
    for row in rows {
        if let Ok(o) = &row.result {
            out.push_str(&format!("- {}: {}.\n", row.name, notes(o)));
        }
    }
    out
}

/// The latency distributions as empirical CDFs on a logarithmic time axis, one line per measured
/// system, as SVG text.
pub fn svg(rows: &[Row], title: &str) -> Result<String, String> {
    use plotters::prelude::*;
    let measured: Vec<(&str, Vec<f64>)> = rows
        .iter()
        .filter_map(|r| {
            let o = r.result.as_ref().ok()?;
            let mut v: Vec<f64> = o.latencies.iter().map(|d| d.as_secs_f64() * 1e3).collect();
            v.sort_by(f64::total_cmp);
            (!v.is_empty()).then_some((r.name.as_str(), v))
        })
        .collect();
    let all = measured.iter().flat_map(|(_, v)| v.iter().copied());
    let lo = all.clone().fold(f64::INFINITY, f64::min).max(0.01) * 0.8;
    // Room on the right for the legend, which sits below the slowest curve's rise.
    let hi = all.fold(0.0, f64::max).max(lo * 10.0) * 5.0;
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        BLACK,
    ];
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, (900, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(
                (lo..hi).log_scale().with_key_points(
                    [
                        0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1e3,
                    ]
                    .into_iter()
                    .filter(|k| (lo..=hi).contains(k))
                    .collect(),
                ),
                0.0..1.0,
            )
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("from the ..data rename to a handshake presenting the new certificate (ms, log scale)")
            .y_desc("fraction of rotations")
            .x_label_formatter(&|v| format!("{v}"))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (name, values)) in measured.iter().enumerate() {
            let color = colors[i % colors.len()];
            let n = values.len() as f64;
            // A step function: at each value the fraction rises by 1/n.
            let mut points = vec![(values[0], 0.0)];
            for (k, v) in values.iter().enumerate() {
                points.push((*v, k as f64 / n));
                points.push((*v, (k + 1) as f64 / n));
            }
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(text)
}

/// The machine: cores, CPU model, memory, kernel, distribution.
pub fn machine() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_kib: f64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("MemTotal:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0.0);
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_owned();
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| {
            l.strip_prefix("PRETTY_NAME=")
                .map(|v| v.trim_matches('"').to_owned())
        })
        .unwrap_or_default();
    format!(
        "{cores} cores ({cpu}), {:.0} GiB of memory, Linux {kernel}, {os}",
        mem_kib / 1024.0 / 1024.0
    )
}
