//! An SVG chart of where a training step's time goes: one horizontal bar
//! per mapping, stacked compute, exposed time per dimension and the
//! pipeline bubble.

use crate::cost::StepCost;

const COLOURS: [(&str, &str); 6] = [
    ("compute", "#4e79a7"),
    ("dp", "#f28e2b"),
    ("tp", "#e15759"),
    ("pp", "#76b7b2"),
    ("ep", "#59a14f"),
    ("bubble", "#bab0ac"),
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders the chart.
pub fn chart(costs: &[StepCost]) -> String {
    let width = 900.0;
    let left = 280.0;
    let bar_w = width - left - 40.0;
    let row = 34.0;
    let height = 70.0 + row * costs.len() as f64 + 40.0;
    let max = costs
        .iter()
        .map(|c| c.compute_ms + c.exposed_ms)
        .fold(1e-9, f64::max);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"10\" y=\"20\" font-size=\"15\">Per global step: compute and exposed communication (ms)</text>\n"
    );
    for (i, c) in costs.iter().enumerate() {
        let y = 40.0 + row * i as f64;
        out.push_str(&format!(
            "<text x=\"10\" y=\"{}\">{}</text>\n",
            y + 17.0,
            esc(&c.mapping)
        ));
        let mut parts: Vec<(&str, f64)> = vec![("compute", c.compute_ms)];
        for d in &c.dims {
            parts.push((d.dim.name(), d.exposed_ms));
        }
        parts.push(("bubble", c.bubble_ms));
        let mut x = left;
        for (name, ms) in parts {
            let w = ms / max * bar_w;
            if w <= 0.0 {
                continue;
            }
            let col = COLOURS
                .iter()
                .find(|(n, _)| *n == name)
                .map_or("#999", |(_, c)| c);
            out.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"24\" fill=\"{col}\"><title>{name}: {ms:.1} ms</title></rect>\n"
            ));
            x += w;
        }
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{}\">{:.0} ms, utilisation {:.3}</text>\n",
            (x + 4.0).min(width - 150.0),
            y + 17.0,
            c.compute_ms + c.exposed_ms,
            c.utilisation
        ));
    }
    let ly = height - 20.0;
    for (i, (name, col)) in COLOURS.iter().enumerate() {
        let x = 10.0 + 110.0 * i as f64;
        out.push_str(&format!(
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{col}\"/><text x=\"{}\" y=\"{ly}\">{name}</text>\n",
            ly - 10.0,
            x + 16.0
        ));
    }
    out.push_str("</svg>\n");
    out
}
