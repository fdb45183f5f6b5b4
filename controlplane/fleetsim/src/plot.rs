//! The run's plots as SVG: cost over time per policy, demand against provisioned capacity,
//! and SLO attainment per service.

use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::report::{Report, Sample};

const COLOURS: [RGBColor; 4] = [RGBColor(214, 39, 40), RGBColor(255, 127, 14), RGBColor(31, 119, 180), RGBColor(44, 160, 44)];

fn err(e: impl std::fmt::Display) -> String {
    format!("plotting: {e}")
}

/// One line of a chart: its legend, points, colour and width.
struct Line {
    label: String,
    points: Vec<(f64, f64)>,
    colour: RGBColor,
    width: u32,
}

/// Axes: ranges and descriptions.
struct Axes<'a> {
    x: Range<f64>,
    y: Range<f64>,
    x_desc: &'a str,
    y_desc: &'a str,
}

/// Draws `lines` on one chart into `path`.
fn line_chart(path: &Path, caption: &str, axes: Axes, lines: Vec<Line>, legend: SeriesLabelPosition) -> Result<(), String> {
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(axes.x, axes.y)
        .map_err(err)?;
    chart.configure_mesh().x_desc(axes.x_desc).y_desc(axes.y_desc).draw().map_err(err)?;
    for line in lines {
        let style = line.colour.stroke_width(line.width);
        chart
            .draw_series(LineSeries::new(line.points, style))
            .map_err(err)?
            .label(line.label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
    }
    chart.configure_series_labels().position(legend).background_style(WHITE).border_style(BLACK).draw().map_err(err)?;
    root.present().map_err(err)
}

/// One line per policy over simulated hours: `value` of each of its samples.
fn policy_lines(report: &Report, width: u32, label: impl Fn(&str) -> String, value: impl Fn(&Sample) -> f64) -> Vec<Line> {
    report
        .policies
        .iter()
        .zip(COLOURS)
        .map(|(p, colour)| Line {
            label: label(&p.name),
            points: p.samples.iter().map(|s| (f64::from(s.t_s) / 3600.0, value(s))).collect(),
            colour,
            width,
        })
        .collect()
}

/// Writes `cost.svg`, `capacity.svg` and `attainment.svg` into `dir`.
pub fn write_plots(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let hours = f64::from(report.seconds) / 3600.0;
    let hour = |t: u32| f64::from(t) / 3600.0;

    let cost = dir.join("cost.svg");
    let max = report.policies.iter().flat_map(|p| p.samples.iter().map(|s| s.cost_per_hour)).fold(1.0, f64::max);
    let lines = policy_lines(report, 2, str::to_string, |s| s.cost_per_hour);
    let axes = Axes { x: 0.0..hours, y: 0.0..max * 1.1, x_desc: "simulated hour", y_desc: "$ per hour" };
    line_chart(&cost, "Fleet cost per hour", axes, lines, SeriesLabelPosition::UpperRight)?;

    let capacity = dir.join("capacity.svg");
    let max = report.policies.iter().flat_map(|p| p.samples.iter().map(|s| s.capacity_rps.max(s.demand_rps))).fold(1.0, f64::max);
    let demand = report.policies.first().map(|p| Line {
        label: "demand".into(),
        points: p.samples.iter().map(|s| (hour(s.t_s), s.demand_rps)).collect(),
        colour: BLACK,
        width: 2,
    });
    let lines = demand.into_iter().chain(policy_lines(report, 1, |name| format!("{name} capacity"), |s| s.capacity_rps)).collect();
    let axes = Axes { x: 0.0..hours, y: 0.0..max * 1.1, x_desc: "simulated hour", y_desc: "requests per second" };
    line_chart(&capacity, "Demand and provisioned capacity", axes, lines, SeriesLabelPosition::UpperRight)?;

    let attainment = dir.join("attainment.svg");
    let percent = |w: u64, m: u64| if w == 0 { 100.0 } else { 100.0 * m as f64 / w as f64 };
    // From just below the worst service: the differences are in the last percent.
    let worst = report.policies.iter().flat_map(|p| p.per_service.iter().map(|(_, w, m)| percent(*w, *m))).fold(100.0, f64::min);
    let floor = (worst - 0.05 * (100.0 - worst)).floor().clamp(0.0, 99.0);
    let lines = report
        .policies
        .iter()
        .zip(COLOURS)
        .map(|(p, colour)| {
            let mut per: Vec<f64> = p.per_service.iter().map(|(_, w, m)| percent(*w, *m)).collect();
            per.sort_by(f64::total_cmp);
            Line { label: p.name.clone(), points: per.into_iter().enumerate().map(|(i, v)| (i as f64, v)).collect(), colour, width: 2 }
        })
        .collect();
    let axes =
        Axes { x: 0.0..report.services.max(1) as f64, y: floor..100.05, x_desc: "services, worst first", y_desc: "% of windows met" };
    line_chart(&attainment, "SLO attainment per service (sorted)", axes, lines, SeriesLabelPosition::LowerRight)?;
    Ok(vec![cost, capacity, attainment])
}
