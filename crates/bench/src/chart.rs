//! A recall–queries/s chart of several indexes as a self-contained SVG
//! (no plotting crate: a few lines of markup, readable in any browser).

use std::fmt::Write;

const W: f64 = 720.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// `series`: (name, [(recall, queries/s)]) in sweep order; one line each.
pub fn svg(title: &str, series: &[(&str, Vec<(f64, f64)>)]) -> String {
    let all = || series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1) = all().fold((1.0f64, 0.0f64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    if x1 <= x0 {
        (x0, x1) = (x0 - 0.01, x1 + 0.01);
    }
    let pad = (x1 - x0) * 0.05;
    let (x0, x1) = (x0 - pad, (x1 + pad).min(1.0).max(x0 + pad));
    let y1 = all().fold(0.0f64, |m, p| m.max(p.1)) * 1.1;
    let y1 = if y1 > 0.0 { y1 } else { 1.0 };
    let px = |x: f64| LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT);
    let py = |y: f64| H - BOTTOM - y / y1 * (H - TOP - BOTTOM);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{LEFT}" y="22" font-size="14">{}</text>"#, escape(title));
    // axes with five ticks each
    let (bx, by) = (H - BOTTOM, W - RIGHT);
    let _ = writeln!(s, r#"<path d="M{LEFT},{TOP} V{bx} H{by}" stroke="black" fill="none"/>"#);
    for i in 0..=4 {
        let x = x0 + (x1 - x0) * i as f64 / 4.0;
        let y = y1 * i as f64 / 4.0;
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{x:.3}</text>"#, px(x), bx + 18.0);
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{y:.0}</text>"#, LEFT - 6.0, py(y) + 4.0);
        let _ = writeln!(s, r##"<path d="M{LEFT},{:.1} H{by}" stroke="#ddd"/>"##, py(y));
    }
    let _ =
        writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">recall</text>"#, px((x0 + x1) / 2.0), H - 12.0);
    let _ = writeln!(
        s,
        r#"<text transform="translate(16,{:.1}) rotate(-90)" text-anchor="middle">queries/s</text>"#,
        (TOP + bx) / 2.0
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let d: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ = writeln!(s, r#"<polyline points="{}" stroke="{c}" stroke-width="2" fill="none"/>"#, d.join(" "));
        for &(x, y) in pts {
            let _ = writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#, px(x), py(y));
        }
        let ly = TOP + 20.0 * i as f64 + 10.0;
        let _ = writeln!(s, r#"<rect x="{:.1}" y="{:.1}" width="14" height="4" fill="{c}"/>"#, by + 14.0, ly - 4.0);
        let _ = writeln!(s, r#"<text x="{:.1}" y="{ly:.1}">{}</text>"#, by + 34.0, escape(name));
    }
    s.push_str("</svg>\n");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_each_series_and_its_points() {
        let s = svg("t <1>", &[("gpu_graph", vec![(0.9, 100.0), (0.99, 50.0)]), ("hnsw", vec![(0.95, 80.0)])]);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert_eq!(s.matches("<polyline").count(), 2);
        assert_eq!(s.matches("<circle").count(), 3);
        assert!(s.contains("t &lt;1&gt;") && s.contains(">hnsw</text>"));
    }
}
