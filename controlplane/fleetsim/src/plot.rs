//! The run's plots as SVG: cost over time per policy, demand against provisioned capacity,
//! and SLO attainment per service.

use std::path::Path;

use plotters::prelude::*;

use crate::report::Report;

const COLOURS: [RGBColor; 4] = [RGBColor(214, 39, 40), RGBColor(255, 127, 14), RGBColor(31, 119, 180), RGBColor(44, 160, 44)];

fn err(e: impl std::fmt::Display) -> String {
    format!("plotting: {e}")
}

/// Writes `cost.svg`, `capacity.svg` and `attainment.svg` into `dir`.
pub fn write_plots(report: &Report, dir: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let hours = f64::from(report.seconds) / 3600.0;
    let mut written = Vec::new();

    let path = dir.join("cost.svg");
    {
        let max = report.policies.iter().flat_map(|p| p.samples.iter().map(|s| s.cost_per_hour)).fold(1.0, f64::max);
        let root = SVGBackend::new(&path, (900, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Fleet cost per hour", ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..hours, 0.0..max * 1.1)
            .map_err(err)?;
        chart.configure_mesh().x_desc("simulated hour").y_desc("$ per hour").draw().map_err(err)?;
        for (p, colour) in report.policies.iter().zip(COLOURS) {
            let points = p.samples.iter().map(|s| (f64::from(s.t_s) / 3600.0, s.cost_per_hour));
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                .map_err(err)?
                .label(p.name.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        }
        chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw().map_err(err)?;
        root.present().map_err(err)?;
    }
    written.push(path);

    let path = dir.join("capacity.svg");
    {
        let max = report.policies.iter().flat_map(|p| p.samples.iter().map(|s| s.capacity_rps.max(s.demand_rps))).fold(1.0, f64::max);
        let root = SVGBackend::new(&path, (900, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Demand and provisioned capacity", ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..hours, 0.0..max * 1.1)
            .map_err(err)?;
        chart.configure_mesh().x_desc("simulated hour").y_desc("requests per second").draw().map_err(err)?;
        if let Some(p) = report.policies.first() {
            let demand = p.samples.iter().map(|s| (f64::from(s.t_s) / 3600.0, s.demand_rps));
            chart
                .draw_series(LineSeries::new(demand, BLACK.stroke_width(2)))
                .map_err(err)?
                .label("demand")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        }
        for (p, colour) in report.policies.iter().zip(COLOURS) {
            let points = p.samples.iter().map(|s| (f64::from(s.t_s) / 3600.0, s.capacity_rps));
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(1)))
                .map_err(err)?
                .label(format!("{} capacity", p.name))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(1)));
        }
        chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw().map_err(err)?;
        root.present().map_err(err)?;
    }
    written.push(path);

    let path = dir.join("attainment.svg");
    {
        let root = SVGBackend::new(&path, (900, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let n = report.services.max(1) as f64;
        let percent = |w: u64, m: u64| if w == 0 { 100.0 } else { 100.0 * m as f64 / w as f64 };
        // From just below the worst service: the differences are in the last percent.
        let worst = report.policies.iter().flat_map(|p| p.per_service.iter().map(|(_, w, m)| percent(*w, *m))).fold(100.0, f64::min);
        let floor = (worst - 0.05 * (100.0 - worst)).floor().clamp(0.0, 99.0);
        let mut chart = ChartBuilder::on(&root)
            .caption("SLO attainment per service (sorted)", ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..n, floor..100.05)
            .map_err(err)?;
        chart.configure_mesh().x_desc("services, worst first").y_desc("% of windows met").draw().map_err(err)?;
        for (p, colour) in report.policies.iter().zip(COLOURS) {
            let mut per: Vec<f64> = p.per_service.iter().map(|(_, w, m)| percent(*w, *m)).collect();
            per.sort_by(f64::total_cmp);
            chart
                .draw_series(LineSeries::new(per.into_iter().enumerate().map(|(i, v)| (i as f64, v)), colour.stroke_width(2)))
                .map_err(err)?
                .label(p.name.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    written.push(path);
    Ok(written)
}
