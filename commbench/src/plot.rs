//! The one plotting path of the workspace (plotters, a command-line
//! dependency, so here and not in the library crates): `--plot FILE.svg`,
//! bus bandwidth against size, one line per algorithm or configuration of
//! the run; `plan --svg FILE`, where a training step's time goes.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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

/// The parts of one mapping's bar, in order, with their colours.
const STEP_PARTS: [(&str, RGBColor); 6] = [
    ("compute", RGBColor(0x4e, 0x79, 0xa7)),
    ("dp", RGBColor(0xf2, 0x8e, 0x2b)),
    ("tp", RGBColor(0xe1, 0x57, 0x59)),
    ("pp", RGBColor(0x76, 0xb7, 0xb2)),
    ("ep", RGBColor(0x59, 0xa1, 0x4f)),
    ("bubble", RGBColor(0xba, 0xb0, 0xac)),
];

/// `commbench plan --svg FILE`: where a training step's time goes, one
/// horizontal bar per mapping (best first), stacked compute, exposed time
/// per dimension and the pipeline bubble, labelled with the step's total
/// and utilisation.
pub fn step_chart(path: &str, costs: &[sim::cost::StepCost]) -> Result<(), String> {
    let rows = costs.len().max(1);
    let height = 110 + 40 * rows as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let total = |c: &sim::cost::StepCost| c.compute_ms + c.exposed_ms;
    let max = costs.iter().map(total).fold(1e-9, f64::max) * 1.35;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Per global step: compute and exposed communication (ms)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(12)
        .build_cartesian_2d(0.0..max, 0.0..rows as f64)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("ms")
        .draw()
        .map_err(|e| e.to_string())?;
    let left = |size| {
        TextStyle::from(("sans-serif", size).into_font()).pos(Pos::new(HPos::Left, VPos::Center))
    };
    for (i, c) in costs.iter().enumerate() {
        let top = rows as f64 - i as f64;
        let (y0, y1) = (top - 0.9, top - 0.45);
        chart
            .draw_series(std::iter::once(Text::new(
                c.mapping.clone(),
                (0.0, top - 0.25),
                left(13),
            )))
            .map_err(|e| e.to_string())?;
        let mut parts = vec![("compute", c.compute_ms)];
        parts.extend(c.dims.iter().map(|d| (d.dim.name(), d.exposed_ms)));
        parts.push(("bubble", c.bubble_ms));
        let mut x = 0.0;
        for (name, ms) in parts.into_iter().filter(|(_, ms)| *ms > 0.0) {
            let colour = STEP_PARTS
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(RGBColor(0x99, 0x99, 0x99), |(_, c)| *c);
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x, y0), (x + ms, y1)],
                    colour.filled(),
                )))
                .map_err(|e| e.to_string())?;
            x += ms;
        }
        let label = format!("{:.0} ms, utilisation {:.3}", total(c), c.utilisation);
        chart
            .draw_series(std::iter::once(Text::new(
                label,
                (x + max * 0.01, (y0 + y1) / 2.0),
                left(13),
            )))
            .map_err(|e| e.to_string())?;
    }
    for (name, colour) in STEP_PARTS {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, 0.0), (0.0, 0.0)],
                colour.filled(),
            )))
            .map_err(|e| e.to_string())?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
