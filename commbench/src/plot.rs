//! `--plot FILE.svg`: bus bandwidth against size, one line per algorithm or
//! configuration of the run.

use plotters::prelude::*;

/// One line: a label and (size in bytes, busbw GB/s) points.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Draws the series as an SVG with a log2 size axis.
pub fn draw(path: &str, title: &str, series: &[Series]) -> Result<(), String> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (xmin, xmax) = xs.fold((f64::MAX, 1f64), |(a, b), x| (a.min(x.max(1.0)), b.max(x)));
    let ymax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.1;
    let (lx0, lx1) = (
        xmin.max(1.0).log2(),
        xmax.max(2.0).log2().max(xmin.max(1.0).log2() + 1.0),
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(lx0..lx1, 0.0..ymax)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("bus bandwidth (GB/s)")
        .x_label_formatter(&|v| human(2f64.powf(*v)))
        .draw()
        .map_err(|e| e.to_string())?;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (i, s) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|&(x, y)| (x.max(1.0).log2(), y))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

fn human(b: f64) -> String {
    let b = b.round() as u64;
    if b >= 1 << 30 {
        format!("{}G", b >> 30)
    } else if b >= 1 << 20 {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 {
        format!("{}K", b >> 10)
    } else {
        format!("{b}")
    }
}
