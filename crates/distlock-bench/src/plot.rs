//! Two small SVG charts (grouped bars and lines over categories), enough for
//! docs/benchmarks.md without a plotting dependency.
//!
//! Nothing here can measure rendered text, so every label is laid out
//! against a generous width estimate ([`CHAR_W`] per character) and kept
//! inside the image by that estimate.

use std::fmt::Write;

const W: f64 = 760.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const PLOT_H: f64 = 270.0;
/// The plot's floor; the image grows downwards from here with the legend.
const FLOOR: f64 = TOP + PLOT_H;
/// Narrowest left margin; it widens when tick labels need more.
const MIN_LEFT: f64 = 70.0;
/// Room left of the tick labels for the rotated axis title at x = 16.
const AXIS_TITLE_W: f64 = 24.0;
const FONT: f64 = 12.0;
const TITLE_FONT: f64 = 15.0;
/// Wider than the average sans-serif glyph at [`FONT`], so estimates err
/// towards more room.
const CHAR_W: f64 = 7.0;
const SWATCH: f64 = 12.0;
const LEGEND_GAP: f64 = 20.0;
const LEGEND_ROW: f64 = 18.0;
/// Space kept between legend and tick labels and the image's edges.
const EDGE: f64 = 10.0;
/// Closest two labelled log ticks may sit, in pixels, before the finer
/// 1-2-5 ticks give way to decades.
const MIN_TICK_GAP: f64 = 16.0;
/// A linear axis from zero flattens everything below a tenth of the
/// largest value into the floor, so beyond this max/min ratio the axis is
/// logarithmic.
const LOG_RATIO: f64 = 10.0;
const COLOURS: [&str; 6] = [
    "#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2",
];

fn text_w(s: &str, font: f64) -> f64 {
    s.chars().count() as f64 * CHAR_W * font / FONT
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

fn fmt_num(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Log ticks are 1-2-5 values, so they print exactly with as many decimals
/// as their magnitude needs.
fn fmt_tick(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let decimals = (-v.log10() - 1e-9).ceil().max(0.0) as usize;
        format!("{v:.decimals$}")
    }
}

/// The 1-2-5 values of the decade holding `v`, and the next decade's 1.
fn steps_around(v: f64) -> [f64; 5] {
    let mag = 10f64.powi(v.log10().floor() as i32);
    [0.5 * mag, mag, 2.0 * mag, 5.0 * mag, 10.0 * mag]
}

/// Strictly below, so the smallest value (a bar's whole height, a line's
/// lowest point) never lands on the floor itself.
fn step_below(v: f64) -> f64 {
    steps_around(v)
        .into_iter()
        .rfind(|s| *s < v * (1.0 - 1e-9))
        .unwrap_or(v / 2.0)
}

fn step_at_or_above(v: f64) -> f64 {
    steps_around(v)
        .into_iter()
        .find(|s| *s >= v * (1.0 - 1e-9))
        .unwrap_or(v)
}

#[derive(Debug, Clone, PartialEq)]
enum Scale {
    Linear { top: f64 },
    Log { lo: f64, hi: f64, ticks: Vec<f64> },
}

impl Scale {
    fn for_values(values: impl IntoIterator<Item = f64>) -> Self {
        let values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        let max = values.iter().copied().fold(0.0, f64::max);
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        if values.is_empty() || min <= 0.0 || max / min <= LOG_RATIO {
            return Self::Linear { top: nice(max) };
        }
        let (lo, hi) = (step_below(min), step_at_or_above(max));
        let per_decade = PLOT_H / (hi / lo).log10();
        if per_decade * 2f64.log10() >= MIN_TICK_GAP {
            let mut ticks = Vec::new();
            let mut mag = 10f64.powi(lo.log10().floor() as i32);
            while mag <= hi {
                for m in [1.0, 2.0, 5.0] {
                    let t = m * mag;
                    if t >= lo * (1.0 - 1e-9) && t <= hi * (1.0 + 1e-9) {
                        ticks.push(t);
                    }
                }
                mag *= 10.0;
            }
            return Self::Log { lo, hi, ticks };
        }
        // Too many decades for 1-2-5 ticks: label every `every`-th decade,
        // with the range widened to whole labelled steps.
        let lo_e = min.log10().ceil() as i32 - 1;
        let hi_e = max.log10().ceil() as i32;
        let mut every = 1;
        let hi_e = loop {
            let steps = (hi_e - lo_e + every - 1) / every;
            if PLOT_H / f64::from(steps) >= MIN_TICK_GAP {
                break lo_e + steps * every;
            }
            every += 1;
        };
        let ticks = (lo_e..=hi_e)
            .step_by(every as usize)
            .map(|e| 10f64.powi(e))
            .collect();
        Self::Log {
            lo: 10f64.powi(lo_e),
            hi: 10f64.powi(hi_e),
            ticks,
        }
    }

    /// Height above the floor as a fraction of the plot, clamped to it.
    fn frac(&self, v: f64) -> f64 {
        let f = match self {
            Self::Linear { top } => v / top,
            Self::Log { lo, hi, .. } if v > 0.0 => (v / lo).log10() / (hi / lo).log10(),
            Self::Log { .. } => 0.0,
        };
        f.clamp(0.0, 1.0)
    }

    fn ticks(&self) -> Vec<(f64, String)> {
        match self {
            Self::Linear { top } => (0..=5)
                .map(|i| {
                    let v = top * f64::from(i) / 5.0;
                    (v, fmt_num(v))
                })
                .collect(),
            Self::Log { ticks, .. } => ticks.iter().map(|t| (*t, fmt_tick(*t))).collect(),
        }
    }
}

/// Where the chart's pieces go, settled before anything is drawn because
/// the tick labels set the left margin and the legend sets the height.
#[derive(Debug)]
struct Frame {
    scale: Scale,
    left: f64,
}

impl Frame {
    fn y(&self, v: f64) -> f64 {
        FLOOR - PLOT_H * self.scale.frac(v)
    }

    fn plot_w(&self) -> f64 {
        W - RIGHT - self.left
    }
}

/// Legend entries flowed into rows that fit the image, each row centred;
/// a name too long for a row of its own is cut short.
fn legend_rows(names: &[String]) -> Vec<Vec<(usize, String, f64)>> {
    let avail = W - 2.0 * EDGE;
    let max_chars = ((avail - SWATCH - 4.0) / CHAR_W).floor() as usize;
    let mut rows: Vec<Vec<(usize, String, f64)>> = Vec::new();
    let mut used = f64::INFINITY;
    for (i, n) in names.iter().enumerate() {
        let n = if n.chars().count() > max_chars {
            let mut s: String = n.chars().take(max_chars.saturating_sub(1)).collect();
            s.push('…');
            s
        } else {
            n.clone()
        };
        let w = SWATCH + 4.0 + text_w(&n, FONT);
        let gap = if used.is_finite() { LEGEND_GAP } else { 0.0 };
        if used + gap + w > avail {
            rows.push(Vec::new());
            used = w;
        } else {
            used += gap + w;
        }
        if let Some(row) = rows.last_mut() {
            row.push((i, n, w));
        }
    }
    rows
}

fn start(title: &str, unit: &str, values: Vec<f64>, names: &[String]) -> (String, Frame) {
    let scale = Scale::for_values(values);
    let ticks = scale.ticks();
    let label_w = ticks
        .iter()
        .map(|(_, l)| text_w(l, FONT))
        .fold(0.0, f64::max);
    let left = MIN_LEFT.max(AXIS_TITLE_W + label_w + 6.0);
    let rows = legend_rows(names);
    let height = FLOOR + 70.0 + LEGEND_ROW * (rows.len().max(1) - 1) as f64;
    let frame = Frame { scale, left };

    // Rounded down to the tenth that is printed, so the estimate still fits.
    let title_font =
        (TITLE_FONT.min(TITLE_FONT * (W - 2.0 * EDGE) / text_w(title, TITLE_FONT)) * 10.0).floor()
            / 10.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"{FONT}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"{title_font:.1}\">{}</text>\n",
        W / 2.0,
        escape(title)
    );

    for (v, label) in &ticks {
        let y = frame.y(*v);
        let _ = writeln!(
            out,
            "<line x1=\"{left:.1}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>",
            W - RIGHT,
            left - 6.0,
            y + 4.0,
        );
    }
    let unit = match frame.scale {
        Scale::Linear { .. } => unit.to_string(),
        Scale::Log { .. } => format!("{unit} (log scale)"),
    };
    let _ = writeln!(
        out,
        "<text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" text-anchor=\"middle\">{}</text>",
        TOP + PLOT_H / 2.0,
        TOP + PLOT_H / 2.0,
        escape(&unit)
    );

    for (r, row) in rows.iter().enumerate() {
        let row_w: f64 =
            row.iter().map(|(_, _, w)| w).sum::<f64>() + LEGEND_GAP * (row.len() - 1) as f64;
        let mut x = (W - row_w) / 2.0;
        let y = FLOOR + 48.0 + LEGEND_ROW * r as f64;
        for (i, name, w) in row {
            let _ = writeln!(
                out,
                "<rect x=\"{x:.1}\" y=\"{y}\" width=\"{SWATCH}\" height=\"{SWATCH}\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{}\">{}</text>",
                COLOURS[i % COLOURS.len()],
                x + SWATCH + 4.0,
                y + 10.0,
                escape(name)
            );
            x += w + LEGEND_GAP;
        }
    }
    (out, frame)
}

/// A centred label below the plot, moved in from the edges if it would
/// stick out of the image.
fn x_label(out: &mut String, x: f64, y: f64, label: &str) {
    let half = text_w(label, FONT) / 2.0;
    let x = x.min(W - EDGE - half).max(EDGE + half);
    let _ = writeln!(
        out,
        "<text x=\"{x:.1}\" y=\"{y}\" text-anchor=\"middle\">{}</text>",
        escape(label)
    );
}

/// Grouped bars: one group per category, one bar per series.
pub(crate) fn bars(
    title: &str,
    unit: &str,
    series: &[String],
    groups: &[(String, Vec<f64>)],
) -> String {
    let values = groups.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    let (mut out, frame) = start(title, unit, values, series);
    let group_w = frame.plot_w() / groups.len().max(1) as f64;
    let bar_w = (group_w * 0.8) / series.len().max(1) as f64;
    for (g, (label, values)) in groups.iter().enumerate() {
        let x0 = frame.left + group_w * g as f64 + group_w * 0.1;
        for (s, v) in values.iter().enumerate() {
            let y = frame.y(*v);
            let _ = writeln!(
                out,
                "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{} {}: {}</title></rect>",
                x0 + bar_w * s as f64,
                bar_w * 0.9,
                FLOOR - y,
                COLOURS[s % COLOURS.len()],
                escape(label),
                escape(series.get(s).map_or("", String::as_str)),
                fmt_num(*v)
            );
        }
        x_label(&mut out, x0 + group_w * 0.4, FLOOR + 16.0, label);
    }
    out.push_str("</svg>\n");
    out
}

/// Lines over categorical x values; `None` leaves a gap.
pub(crate) fn lines(
    title: &str,
    unit: &str,
    x_title: &str,
    xs: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> String {
    let values = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .collect();
    let names: Vec<String> = series.iter().map(|(n, _)| n.clone()).collect();
    let (mut out, frame) = start(title, unit, values, &names);
    let plot_w = frame.plot_w();
    let x_at = |i: usize| frame.left + plot_w * (i as f64 + 0.5) / xs.len().max(1) as f64;
    for (i, x) in xs.iter().enumerate() {
        x_label(&mut out, x_at(i), FLOOR + 16.0, x);
    }
    x_label(&mut out, frame.left + plot_w / 2.0, FLOOR + 34.0, x_title);
    for (s, (_, values)) in series.iter().enumerate() {
        let colour = COLOURS[s % COLOURS.len()];
        let points: Vec<Option<(f64, f64)>> = values
            .iter()
            .enumerate()
            .map(|(i, v)| v.map(|v| (x_at(i), frame.y(v))))
            .collect();
        for run in points.split(Option::is_none) {
            let run: Vec<String> = run
                .iter()
                .flatten()
                .map(|(x, y)| format!("{x:.1},{y:.1}"))
                .collect();
            if run.len() > 1 {
                let _ = writeln!(
                    out,
                    "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>",
                    run.join(" ")
                );
            }
        }
        for (x, y) in points.iter().flatten() {
            let _ = writeln!(
                out,
                "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{colour}\"/>"
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(tag: &str, name: &str) -> Option<String> {
        let key = format!(" {name}=\"");
        let start = tag.find(&key)? + key.len();
        let len = tag[start..].find('"')?;
        Some(tag[start..start + len].to_string())
    }

    fn num(tag: &str, name: &str) -> Option<f64> {
        attr(tag, name)?.parse().ok()
    }

    /// Every element opening with `<{name}`, as (opening tag, content up to
    /// the next `<`).
    fn elements<'a>(svg: &'a str, name: &str) -> Vec<(&'a str, &'a str)> {
        let open = format!("<{name} ");
        svg.match_indices(&open)
            .map(|(i, _)| {
                let rest = &svg[i..];
                let end = rest.find('>').unwrap();
                let body = &rest[end + 1..];
                (&rest[..end], &body[..body.find('<').unwrap_or(body.len())])
            })
            .collect()
    }

    fn size(svg: &str) -> (f64, f64) {
        let (tag, _) = elements(svg, "svg")[0];
        (num(tag, "width").unwrap(), num(tag, "height").unwrap())
    }

    /// Failures as readable lines: each text (its estimated box) or rect
    /// that reaches outside the image.
    fn outside(svg: &str) -> Vec<String> {
        let (w, h) = size(svg);
        let mut bad = Vec::new();
        for (tag, content) in elements(svg, "text") {
            let text = content
                .replace("&amp;", "&")
                .replace("&lt;", "<")
                .replace("&gt;", ">");
            let font = num(tag, "font-size").unwrap_or(FONT);
            let len = text_w(&text, font);
            let (x, y) = (num(tag, "x").unwrap(), num(tag, "y").unwrap());
            let before = match attr(tag, "text-anchor").as_deref() {
                Some("middle") => len / 2.0,
                Some("end") => len,
                _ => 0.0,
            };
            // Rotated a quarter turn, the run of text goes up the page and
            // the glyphs' height lies along x.
            let (x0, x1, y0, y1) = if tag.contains("rotate(-90") {
                (x - font, x + font * 0.3, y - (len - before), y + before)
            } else {
                (x - before, x - before + len, y - font, y + font * 0.3)
            };
            if x0 < 0.0 || x1 > w || y0 < 0.0 || y1 > h {
                bad.push(format!(
                    "text {text:?}: x {x0:.0}..{x1:.0}, y {y0:.0}..{y1:.0}"
                ));
            }
        }
        for (tag, _) in elements(svg, "rect") {
            let (Some(x), Some(rw)) = (num(tag, "x"), num(tag, "width")) else {
                continue;
            };
            let (y, rh) = (num(tag, "y").unwrap(), num(tag, "height").unwrap());
            if x < 0.0 || x + rw > w || y < 0.0 || y + rh > h {
                bad.push(format!("rect at x {x}, y {y}"));
            }
        }
        bad
    }

    fn floor_y(svg: &str) -> f64 {
        elements(svg, "line")
            .iter()
            .map(|(tag, _)| num(tag, "y1").unwrap())
            .fold(0.0, f64::max)
    }

    /// Each polyline's points, in the order the series were given.
    fn polylines(svg: &str) -> Vec<Vec<(f64, f64)>> {
        elements(svg, "polyline")
            .iter()
            .map(|(tag, _)| {
                attr(tag, "points")
                    .unwrap()
                    .split(' ')
                    .map(|p| {
                        let (x, y) = p.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect()
            })
            .collect()
    }

    fn tick_labels(svg: &str) -> Vec<String> {
        elements(svg, "text")
            .iter()
            .filter(|(tag, _)| attr(tag, "text-anchor").as_deref() == Some("end"))
            .map(|(_, t)| t.to_string())
            .collect()
    }

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// The handoff p50s of the run in docs/bench/results.md.
    fn handoff_run() -> Vec<(String, Vec<Option<f64>>)> {
        [
            ("sqlite", [311.0, 316.0, 460.0]),
            ("postgres", [611.0, 948.0, 11423.0]),
            ("redis", [297.0, 410.0, 1342.0]),
            ("redlock", [331.0, 446.0, 5431.0]),
            ("etcd", [1188.0, 1262.0, 1302.0]),
            ("zookeeper", [647.0, 787.0, 932.0]),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v.into_iter().map(Some).collect()))
        .collect()
    }

    fn handoff_svg(series: &[(String, Vec<Option<f64>>)]) -> String {
        lines(
            "Handoff latency p50 (µs) against waiters",
            "µs",
            "waiters",
            &strings(&["1", "10", "100"]),
            series,
        )
    }

    #[test]
    fn every_label_and_legend_entry_stays_inside_the_image() {
        let svg = handoff_svg(&handoff_run());
        assert_eq!(outside(&svg), Vec::<String>::new(), "{svg}");

        let groups: Vec<(String, Vec<f64>)> = ["sqlite", "postgres", "zookeeper"]
            .iter()
            .map(|g| (g.to_string(), vec![79.0, 81.0, 145.0, 141.0]))
            .collect();
        let svg = bars(
            "Uncontended acquire+release latency (µs), distlock vs raw",
            "µs",
            &strings(&["raw p50", "distlock p50", "raw p99", "distlock p99"]),
            &groups,
        );
        assert_eq!(outside(&svg), Vec::<String>::new(), "{svg}");

        // Long names, a long title, huge tick values, an edge label wider
        // than its slot.
        let many: Vec<(String, Vec<Option<f64>>)> = (0..9)
            .map(|i| {
                (
                    format!("backend number {i} with a long descriptive name"),
                    vec![Some(1e6 * f64::from(i + 1)), Some(2.5e6)],
                )
            })
            .chain([("x".repeat(200), vec![Some(3.0), None])])
            .collect();
        let svg = lines(
            &"a very long title that keeps going ".repeat(5),
            "µs",
            "waiters",
            &strings(&["a label much wider than the slot it is centred on", "z"]),
            &many,
        );
        assert_eq!(outside(&svg), Vec::<String>::new(), "{svg}");
    }

    #[test]
    fn legend_wraps_into_rows_and_the_image_grows_to_hold_them() {
        let one = handoff_svg(&handoff_run());
        let rows_of = |svg: &str| {
            let mut ys: Vec<String> = elements(svg, "rect")
                .iter()
                .filter(|(tag, _)| num(tag, "width") == Some(SWATCH))
                .map(|(tag, _)| attr(tag, "y").unwrap())
                .collect();
            ys.dedup();
            ys.len()
        };
        assert_eq!(rows_of(&one), 1);

        let long: Vec<(String, Vec<Option<f64>>)> = (0..8)
            .map(|i| (format!("a fairly long series name {i}"), vec![Some(1.0)]))
            .collect();
        let svg = handoff_svg(&long);
        assert!(rows_of(&svg) >= 3, "{svg}");
        assert!(size(&svg).1 > size(&one).1);
        assert_eq!(outside(&svg), Vec::<String>::new(), "{svg}");
    }

    #[test]
    fn values_spanning_orders_of_magnitude_get_a_log_axis_with_1_2_5_ticks() {
        assert_eq!(
            Scale::for_values([79.0, 81.0, 844.0, 3543.0]),
            Scale::Log {
                lo: 50.0,
                hi: 5000.0,
                ticks: vec![50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0],
            }
        );
        let svg = handoff_svg(&handoff_run());
        assert_eq!(
            tick_labels(&svg),
            strings(&["200", "500", "1000", "2000", "5000", "10000", "20000"])
        );
        assert!(svg.contains(">µs (log scale)</text>"));
    }

    #[test]
    fn log_axis_lifts_the_smallest_series_off_the_floor_and_apart() {
        let series: Vec<(String, Vec<Option<f64>>)> = [
            ("small", [300.0, 320.0, 450.0]),
            ("double", [600.0, 640.0, 900.0]),
            ("large", [20000.0, 90000.0, 300000.0]),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v.into_iter().map(Some).collect()))
        .collect();
        let svg = handoff_svg(&series);
        let floor = floor_y(&svg);
        let lines = polylines(&svg);
        let small_low = lines[0].iter().map(|p| p.1).fold(0.0, f64::max);
        assert!(floor - small_low >= 10.0, "{floor} vs {small_low}: {svg}");
        // Twice the value is a fixed, visible step up anywhere on the axis.
        assert!(lines[0][0].1 - lines[1][0].1 >= 15.0, "{svg}");
        assert!(
            lines[2][2].1 >= TOP - 0.05,
            "the top point stays in the plot"
        );
    }

    #[test]
    fn many_decades_fall_back_to_decade_ticks_with_room_between_them() {
        let Scale::Log { lo, hi, ticks } = Scale::for_values([0.002, 3e15]) else {
            panic!("expected a log axis");
        };
        assert!(lo <= 0.002 && hi >= 3e15);
        assert_eq!(ticks.first(), Some(&lo));
        assert_eq!(ticks.last(), Some(&hi));
        let per_tick = PLOT_H / (ticks.len() - 1) as f64;
        assert!(per_tick >= MIN_TICK_GAP, "{ticks:?}");
    }

    #[test]
    fn narrow_or_non_positive_ranges_keep_a_linear_axis_from_zero() {
        assert_eq!(
            Scale::for_values([300.0, 900.0, 1302.0]),
            Scale::Linear { top: 2000.0 }
        );
        assert_eq!(
            Scale::for_values([0.0, 5.0, 900.0]),
            Scale::Linear { top: 1000.0 }
        );
        assert_eq!(Scale::for_values([]), Scale::Linear { top: 1.0 });
        let svg = handoff_svg(&[("a".into(), vec![Some(300.0), Some(900.0)])]);
        assert_eq!(tick_labels(&svg)[0], "0");
        assert!(!svg.contains("log scale"));
    }

    #[test]
    fn a_missing_value_breaks_the_line() {
        let svg = lines(
            "t",
            "µs",
            "waiters",
            &strings(&["1", "10", "100", "1000"]),
            &[("a".into(), vec![Some(1.0), Some(2.0), None, Some(3.0)])],
        );
        let lines = polylines(&svg);
        assert_eq!(lines.len(), 1, "the lone point after the gap is only a dot");
        assert_eq!(lines[0].len(), 2);
        assert_eq!(elements(&svg, "circle").len(), 3);
    }

    #[test]
    fn tick_labels_print_1_2_5_values_exactly() {
        assert_eq!(fmt_tick(20000.0), "20000");
        assert_eq!(fmt_tick(0.05), "0.05");
        assert_eq!(fmt_tick(0.2), "0.2");
        assert_eq!(fmt_tick(0.001), "0.001");
        assert_eq!(step_below(100.0), 50.0);
        assert_eq!(step_below(297.0), 200.0);
        assert_eq!(step_at_or_above(11423.0), 20000.0);
        assert_eq!(step_at_or_above(5000.0), 5000.0);
    }
}
