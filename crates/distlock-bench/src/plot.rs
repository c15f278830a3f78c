//! Two small SVG charts (grouped bars and lines over categories), enough for
//! docs/benchmarks.md without a plotting dependency.

use std::fmt::Write;

const W: f64 = 760.0;
const H: f64 = 380.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 70.0;
const COLOURS: [&str; 6] = [
    "#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2",
];

fn header(title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        W / 2.0,
        escape(title)
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" axis maximum at or above `max`.
fn nice(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|v| *v >= max)
        .unwrap_or(10.0 * mag)
}

fn y_axis(out: &mut String, top: f64, unit: &str) {
    let plot_h = H - TOP - BOTTOM;
    for i in 0..=5 {
        let v = top * f64::from(i) / 5.0;
        let y = H - BOTTOM - plot_h * f64::from(i) / 5.0;
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            fmt_num(v)
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" text-anchor=\"middle\">{}</text>",
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        escape(unit)
    );
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn legend(out: &mut String, names: &[String]) {
    for (i, n) in names.iter().enumerate() {
        let x = LEFT + 10.0 + 150.0 * i as f64;
        let _ = writeln!(
            out,
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            H - 22.0,
            COLOURS[i % COLOURS.len()],
            x + 16.0,
            H - 12.0,
            escape(n)
        );
    }
}

/// Grouped bars: one group per category, one bar per series.
pub(crate) fn bars(
    title: &str,
    unit: &str,
    series: &[String],
    groups: &[(String, Vec<f64>)],
) -> String {
    let mut out = header(title);
    let max = groups
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0, f64::max);
    let top = nice(max);
    y_axis(&mut out, top, unit);
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let group_w = plot_w / groups.len().max(1) as f64;
    let bar_w = (group_w * 0.8) / series.len().max(1) as f64;
    for (g, (label, values)) in groups.iter().enumerate() {
        let x0 = LEFT + group_w * g as f64 + group_w * 0.1;
        for (s, v) in values.iter().enumerate() {
            let h = plot_h * v / top;
            let _ = writeln!(
                out,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\"><title>{} {}: {}</title></rect>",
                x0 + bar_w * s as f64,
                H - BOTTOM - h,
                bar_w * 0.9,
                COLOURS[s % COLOURS.len()],
                escape(label),
                escape(&series[s]),
                fmt_num(*v)
            );
        }
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x0 + group_w * 0.4,
            H - BOTTOM + 16.0,
            escape(label)
        );
    }
    legend(&mut out, series);
    out.push_str("</svg>\n");
    out
}

/// Lines over categorical x values; `None` leaves a gap.
pub(crate) fn lines(
    title: &str,
    unit: &str,
    x_label: &str,
    xs: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> String {
    let mut out = header(title);
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .fold(0.0, f64::max);
    let top = nice(max);
    y_axis(&mut out, top, unit);
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let x_at = |i: usize| LEFT + plot_w * (i as f64 + 0.5) / xs.len().max(1) as f64;
    for (i, x) in xs.iter().enumerate() {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x_at(i),
            H - BOTTOM + 16.0,
            escape(x)
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        LEFT + plot_w / 2.0,
        H - BOTTOM + 34.0,
        escape(x_label)
    );
    for (s, (_, values)) in series.iter().enumerate() {
        let colour = COLOURS[s % COLOURS.len()];
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                v.map(|v| format!("{:.1},{:.1}", x_at(i), H - BOTTOM - plot_h * v / top))
            })
            .collect();
        let _ = writeln!(
            out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>",
            points.join(" ")
        );
        for p in &points {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                out,
                "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{colour}\"/>"
            );
        }
    }
    let names: Vec<String> = series.iter().map(|(n, _)| n.clone()).collect();
    legend(&mut out, &names);
    out.push_str("</svg>\n");
    out
}
