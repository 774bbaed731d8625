//! SVG charts drawn with plotters' SVG backend (text is emitted as SVG
//! `<text>`, so no fonts are needed at build or run time).

use std::collections::BTreeMap;

use plotters::prelude::*;

/// Chart size in pixels.
const SIZE: (u32, u32) = (860, 420);

/// One polyline of a line chart.
pub(crate) struct Line {
    pub label: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
}

/// A labelled vertical marker (stage boundary).
pub(crate) struct Marker {
    pub x: f64,
    pub label: String,
}

/// Distinct colours for series, in order.
pub(crate) const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub(crate) fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Axis tick label: at most 6 decimals, trailing zeros trimmed ("20", "0.35").
fn tick(v: &f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Pads a `[lo, hi]` range so that it is non-empty and the data does not
/// touch the frame.
fn padded(lo: f64, hi: f64, frac: f64) -> (f64, f64) {
    let span = hi - lo;
    if span.abs() < 1e-12 {
        let d = if lo.abs() > 1e-9 { lo.abs() * 0.1 } else { 0.5 };
        (lo - d, hi + d)
    } else {
        (lo - span * frac, hi + span * frac)
    }
}

/// Draws a line chart; `Ok(None)` when there is no finite point to draw.
/// Markers outside the data's x range are not drawn.
pub(crate) fn line_chart(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[Line],
    markers: &[Marker],
) -> Result<Option<String>, String> {
    let finite = |p: &&(f64, f64)| p.0.is_finite() && p.1.is_finite();
    let lines: Vec<(&Line, Vec<(f64, f64)>)> = lines
        .iter()
        .map(|l| {
            let mut pts: Vec<(f64, f64)> = l.points.iter().filter(finite).copied().collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (l, pts)
        })
        .filter(|(_, pts)| !pts.is_empty())
        .collect();
    let all = || lines.iter().flat_map(|(_, p)| p.iter());
    let Some(first) = all().next() else {
        return Ok(None);
    };
    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (first.0, first.0, first.1, first.1);
    for &(x, y) in all() {
        x_lo = x_lo.min(x);
        x_hi = x_hi.max(x);
        y_lo = y_lo.min(y);
        y_hi = y_hi.max(y);
    }
    let (dx_lo, dx_hi) = (x_lo, x_hi);
    let (x_lo, x_hi) = padded(x_lo, x_hi, 0.01);
    let (y_lo, y_hi) = padded(y_lo, y_hi, 0.08);

    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .light_line_style(RGBColor(240, 240, 240))
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .draw()
            .map_err(err)?;

        let marker_style = ShapeStyle::from(&RGBColor(120, 120, 120)).stroke_width(1);
        for m in markers {
            if !m.x.is_finite() || m.x < dx_lo || m.x > dx_hi {
                continue;
            }
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(m.x, y_lo), (m.x, y_hi)],
                    6,
                    4,
                    marker_style,
                ))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    m.label.clone(),
                    (m.x, y_hi),
                    ("sans-serif", 12).into_font().color(&RGBColor(80, 80, 80)),
                )))
                .map_err(err)?;
        }

        for (line, pts) in &lines {
            let c = line.color;
            let size = if pts.len() == 1 { 3 } else { 0 };
            chart
                .draw_series(
                    LineSeries::new(pts.iter().copied(), c.stroke_width(2)).point_size(size),
                )
                .map_err(err)?
                .label(line.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(Some(buf))
}

/// Draws a histogram of `counts` (value → count); `Ok(None)` when empty.
pub(crate) fn histogram(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    counts: &BTreeMap<u64, u64>,
) -> Result<Option<String>, String> {
    let Some((&max_value, _)) = counts.iter().next_back() else {
        return Ok(None);
    };
    let max_count = counts.values().copied().max().unwrap_or(0);
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(
                // A segmented `0..n` shows the slots 0..=n.
                (0u64..max_value.max(1)).into_segmented(),
                0u64..max_count + max_count / 10 + 1,
            )
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .light_line_style(RGBColor(240, 240, 240))
            .x_label_formatter(&|v| match v {
                SegmentValue::Exact(v) | SegmentValue::CenterOf(v) => v.to_string(),
                SegmentValue::Last => String::new(),
            })
            .draw()
            .map_err(err)?;
        chart
            .draw_series(
                Histogram::vertical(&chart)
                    .style(color(0).filled())
                    .margin(3)
                    .data(counts.iter().map(|(&v, &c)| (v, c))),
            )
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(Some(buf))
}
