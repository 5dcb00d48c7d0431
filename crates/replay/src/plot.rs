//! The run's picture: tokens the provider charged in the trailing window on its
//! binding token limit (as it finally charged them, counted from each admission),
//! against that limit and the demand that arrived, over the run. The font is
//! compiled in (DejaVu Sans), so a fresh machine without fonts draws it too.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::outcome::RequestOutcome;
use crate::sim::provider::Admission;

/// Points per window: the curve is sampled this often.
pub const SAMPLES_PER_WINDOW: u64 = 20;
/// The most points per curve, so a long run still draws quickly.
pub const SAMPLES_MAX: u64 = 4_000;
/// The picture's size, in pixels.
pub const SIZE_PX: (u32, u32) = (900, 450);
/// The font family name the embedded font is registered under.
const FONT: &str = "sans-serif";

/// One curve sample: seconds since the start, and tokens in the trailing window.
pub type Sample = (f64, f64);

/// The trailing-window sums of the tokens admissions charged on token limit
/// `limit_index` (their settled charge) and of offered tokens, sampled over the run.
pub fn trailing_window_series(
    admissions: &[Admission],
    limit_index: usize,
    outcomes: &[RequestOutcome],
    window_ms: u64,
    start_unix_ms: u64,
    end_unix_ms: u64,
) -> (Vec<Sample>, Vec<Sample>) {
    let span_ms = end_unix_ms.saturating_sub(start_unix_ms).max(1);
    let step_ms = (window_ms / SAMPLES_PER_WINDOW).max(span_ms / SAMPLES_MAX).max(1);
    let mut admitted: Vec<(u64, u64)> = (admissions.iter())
        .map(|a| (a.at_unix_ms, a.settled_tokens[limit_index]))
        .collect();
    let mut offered: Vec<(u64, u64)> = outcomes.iter().map(|o| (o.arrival_unix_ms, o.offered_tokens)).collect();
    admitted.sort_unstable();
    offered.sort_unstable();
    let trailing = |events: &[(u64, u64)], at: u64| -> f64 {
        let from = events.partition_point(|&(t, _)| t + window_ms <= at);
        let to = events.partition_point(|&(t, _)| t <= at);
        events[from..to].iter().map(|&(_, n)| n as f64).sum()
    };
    let mut series = (Vec::new(), Vec::new());
    let mut at = start_unix_ms;
    while at <= end_unix_ms {
        let x = (at - start_unix_ms) as f64 / 1000.0;
        series.0.push((x, trailing(&admitted, at)));
        series.1.push((x, trailing(&offered, at)));
        at += step_ms;
    }
    series
}

/// The token limit a picture draws: its name in the legend, its capacity and window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlottedLimit<'a> {
    /// The legend's name of the limit (`tokens`, `output tokens`).
    pub name: &'a str,
    /// Its capacity per window.
    pub capacity: u64,
    /// The window, in ms.
    pub window_ms: u64,
}

/// Draws the run into a PNG at `path`, titled `title`: tokens `admitted` on
/// `limit` against it, and the `offered` demand when it is in the limit's units.
pub fn draw(
    path: &Path,
    title: &str,
    limit: &PlottedLimit<'_>,
    admitted: &[Sample],
    offered: Option<&[Sample]>,
) -> Result<(), String> {
    static FONT_ONCE: Once = Once::new();
    FONT_ONCE.call_once(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .unwrap_or_else(|_| panic!("the embedded DejaVu font is valid"));
    });
    let root = BitMapBackend::new(path, SIZE_PX).into_drawing_area();
    let to_string = |e: DrawingAreaErrorKind<_>| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(to_string)?;
    let x_max = admitted.last().map_or(1.0, |s| s.0).max(1.0);
    let peak = admitted
        .iter()
        .chain(offered.unwrap_or_default())
        .map(|s| s.1)
        .fold(limit.capacity as f64, f64::max);
    let window_s = limit.window_ms as f64 / 1000.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..x_max, 0.0..peak * 1.1)
        .map_err(to_string)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the first arrival")
        .y_desc(format!("tokens per {window_s} s (trailing window)"))
        .y_label_formatter(&|v| format_tokens(*v))
        .label_style((FONT, 13))
        // No fine grid: the picture stays readable and its PNG small.
        .light_line_style(WHITE)
        .draw()
        .map_err(to_string)?;
    let capacity = [(0.0, limit.capacity as f64), (x_max, limit.capacity as f64)];
    let limit_label = format!("provider limit ({})", limit.name);
    let admitted_label = format!("charged by the provider ({})", limit.name);
    let mut lines: Vec<(&str, Vec<Sample>, RGBColor)> = Vec::new();
    if let Some(offered) = offered {
        lines.push(("offered demand", offered.to_vec(), RGBColor(170, 170, 170)));
    }
    lines.push((&limit_label, capacity.to_vec(), RED));
    lines.push((&admitted_label, admitted.to_vec(), BLUE));
    for (label, points, color) in lines {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(to_string)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(to_string)?;
    root.present().map_err(to_string)
}

/// Axis labels in plain units: 950, 12k, 1.5M.
fn format_tokens(value: f64) -> String {
    match value.abs() {
        v if v >= 1e6 => format!("{:.1}M", value / 1e6),
        v if v >= 1e3 => format!("{:.0}k", value / 1e3),
        _ => format!("{value:.0}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_window_sums_only_the_last_window() {
        let admissions = [
            Admission {
                at_unix_ms: 1_000,
                charged_tokens: 50,
                settled_tokens: [5, 1],
            },
            Admission {
                at_unix_ms: 1_500,
                charged_tokens: 70,
                settled_tokens: [7, 2],
            },
        ];
        let (admitted, offered) = trailing_window_series(&admissions, 0, &[], 1_000, 1_000, 3_000);
        let at = |x: f64| admitted.iter().find(|s| (s.0 - x).abs() < 1e-9).unwrap().1;
        assert_eq!(at(0.0), 5.0);
        assert_eq!(at(0.5), 12.0);
        assert_eq!(at(0.95), 12.0);
        assert_eq!(at(1.0), 7.0);
        assert_eq!(at(1.5), 0.0);
        assert_eq!(admitted.len(), 41);
        assert!(offered.iter().all(|s| s.1 == 0.0));
        let (output, _) = trailing_window_series(&admissions, 1, &[], 1_000, 1_000, 3_000);
        assert_eq!(output[10].1, 3.0, "the second limit's settled charges");
    }

    #[test]
    fn draws_a_png() {
        let limit = PlottedLimit {
            name: "tokens",
            capacity: 100,
            window_ms: 1_000,
        };
        let admitted: Vec<Sample> = (0..50).map(|i| (i as f64 / 10.0, 90.0)).collect();
        let path = std::env::temp_dir().join(format!("replay-plot-{}.png", std::process::id()));
        draw(&path, "test", &limit, &admitted, Some(&admitted)).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_file(&path).unwrap();
    }
}
