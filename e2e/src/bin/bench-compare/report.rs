//! The comparison table: one row per figure for both sides, printed, written as JSON and TSV, and
//! drawn as one chart panel per figure (both sides, the unit and the ratio; the run's date, sizes
//! and load in the chart's subtitle).

use std::path::Path;
use std::time::Duration;

use e2e::bench::{machine_load, percentile, register_chart_font};
use serde_json::{json, Value};

/// One line of the comparison: a figure for both sides (lower is better unless the figure's name
/// says HIGHER).
pub struct Row {
    pub figure: String,
    pub unit: &'static str,
    pub ours: Option<f64>,
    pub upstream: Option<f64>,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        match (self.ours, self.upstream) {
            (Some(o), Some(u)) if u > 0.0 => Some(o / u),
            _ => None,
        }
    }

    /// figure, unit, ours, upstream, ours/upstream, as printed.
    fn cells(&self) -> [String; 5] {
        [
            self.figure.clone(),
            self.unit.to_string(),
            fmt(self.ours),
            fmt(self.upstream),
            fmt(self.ratio()),
        ]
    }
}

/// The `p` percentile of `samples` (pooled from every round), if there are any.
pub fn pooled(samples: impl Iterator<Item = Duration>, p: f64) -> Option<Duration> {
    let mut all: Vec<Duration> = samples.collect();
    all.sort();
    (!all.is_empty()).then(|| percentile(&all, p))
}

pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

fn fmt(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

pub fn print_rows(rows: &[Row]) {
    let header = ["figure", "unit", "ours", "upstream", "ours/upstream"].map(String::from);
    for [figure, unit, ours, upstream, ratio] in
        std::iter::once(header).chain(rows.iter().map(Row::cells))
    {
        println!("{figure:<62} {unit:>7} {ours:>10} {upstream:>10} {ratio:>14}");
    }
}

/// Writes the JSON report, the TSV table and the chart under `dir`.
pub fn write_results(
    dir: &Path,
    sizes: Value,
    rows: &[Row],
    samples: Value,
    failures: &[String],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (load, cpus) = machine_load();
    let report = json!({
        "bench": "bench-compare",
        "upstream": "argocd-agent v0.9.0 (hack/peers.sh)",
        "note": "cells: managed and autonomous, 1 agent, no Argo CD, the bench writes the spoke status \
                 and the spoke's resource tree itself; rows naming simulated agents: the same \
                 protocol-level simulated agents against both principals",
        "sizes": &sizes,
        "machine": {"cpus": cpus, "load_average_1m_at_end": load},
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs(),
        "figures": rows.iter().map(|r| json!({
            "figure": r.figure, "unit": r.unit, "ours": r.ours, "upstream": r.upstream,
            "ratio": r.ratio(),
        })).collect::<Vec<_>>(),
        "samples": samples,
        "failures": failures,
    });
    std::fs::write(
        dir.join("bench-compare.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    let mut tsv = String::from("figure\tunit\tours\tupstream\tours_over_upstream\n");
    for r in rows {
        tsv += &(r.cells().join("\t") + "\n");
    }
    std::fs::write(dir.join("bench-compare.tsv"), tsv)?;
    draw_chart(
        &dir.join("bench-compare.png"),
        rows,
        &run_context(&sizes, load, cpus),
    )?;
    eprintln!(
        "==> wrote bench-compare.json, bench-compare.tsv and bench-compare.png in {}",
        dir.display()
    );
    Ok(())
}

/// The run's date (UTC, to the minute), for the chart's subtitle.
fn utc_now() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{}-{:02}-{:02} {:02}:{:02} UTC",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute()
    )
}

/// The chart's subtitle: when, at which sizes and under which load the figures were measured.
fn run_context(sizes: &Value, load: f64, cpus: usize) -> String {
    let size = |k: &str| {
        sizes
            .get(k)
            .map(Value::to_string)
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "{}; {} round(s), {} samples per latency per round, {} Applications, {} offline changes; \
         {cpus} CPUs, load average (1 min) {load:.1} at the end",
        utc_now(),
        size("rounds"),
        size("count"),
        size("apps"),
        size("changes"),
    )
}

/// One panel per figure, a bar for each side in the figure's own unit, the ratio in the panel's
/// title; figures that are 0 on both sides (the fault counts, when nothing was lost) are listed
/// as text below the panels instead of as empty panels.
fn draw_chart(path: &Path, rows: &[Row], context: &str) -> anyhow::Result<()> {
    use plotters::prelude::*;
    register_chart_font()?;
    const COLUMNS: usize = 4;
    const PANEL: (u32, u32) = (400, 210);
    const HEADER: u32 = 64;
    const TEXT_LINE: u32 = 18;
    let both_zero = |r: &&Row| r.ours.unwrap_or(0.0) == 0.0 && r.upstream.unwrap_or(0.0) == 0.0;
    let (zeros, panels): (Vec<&Row>, Vec<&Row>) = rows.iter().partition(both_zero);
    let lines = panels.len().div_ceil(COLUMNS) as u32;
    let footer = if zeros.is_empty() {
        0
    } else {
        (zeros.len() as u32 + 1) * TEXT_LINE + 16
    };
    let size = (PANEL.0 * COLUMNS as u32, HEADER + PANEL.1 * lines + footer);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    root.draw_text(
        "bench-compare: ours (blue) vs upstream argocd-agent v0.9.0 (orange); each panel: figure \
         (unit), ours/upstream; lower is better unless a panel says HIGHER",
        &("sans-serif", 19).into_text_style(&root),
        (10, 8),
    )?;
    root.draw_text(
        context,
        &("sans-serif", 15).into_text_style(&root),
        (10, 36),
    )?;
    let (body, rest) = root.split_vertically(HEADER + PANEL.1 * lines);
    let (_, body) = body.split_vertically(HEADER);
    let orange = RGBColor(230, 140, 30);
    for (area, row) in body
        .split_evenly((lines as usize, COLUMNS))
        .iter()
        .zip(&panels)
    {
        let top = row.ours.unwrap_or(0.0).max(row.upstream.unwrap_or(0.0));
        let top = if top > 0.0 { top * 1.25 } else { 1.0 };
        let ratio = row
            .ratio()
            .map(|r| format!(": {r:.2}x"))
            .unwrap_or_default();
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{} ({}){ratio}", row.figure, row.unit),
                ("sans-serif", 12),
            )
            .margin(8)
            .y_label_area_size(46)
            .build_cartesian_2d(0f64..2f64, 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .disable_x_axis()
            .max_light_lines(0)
            .y_labels(5)
            .label_style(("sans-serif", 11))
            .draw()?;
        for (x, value, color, who) in [
            (0.0, row.ours, BLUE.mix(0.7), "ours"),
            (1.0, row.upstream, orange.mix(0.9), "upstream"),
        ] {
            let v = value.unwrap_or(0.0);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x + 0.2, 0.0), (x + 0.8, v)],
                color.filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                format!("{who} {} {}", fmt(value), row.unit),
                (x + 0.2, v + top * 0.08),
                ("sans-serif", 12).into_font(),
            )))?;
        }
    }
    if !zeros.is_empty() {
        let style = ("sans-serif", 14).into_text_style(&rest);
        rest.draw_text(
            "0 or not measured on both sides (ours / upstream):",
            &style,
            (10, 8),
        )?;
        for (i, row) in zeros.iter().enumerate() {
            rest.draw_text(
                &format!(
                    "{} ({}): {} / {}",
                    row.figure,
                    row.unit,
                    fmt(row.ours),
                    fmt(row.upstream)
                ),
                &style,
                (24, 8 + TEXT_LINE as i32 * (i as i32 + 1)),
            )?;
        }
    }
    root.present()?;
    Ok(())
}
