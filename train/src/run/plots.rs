//! The charts of an experiment, each as PNG and SVG: validation loss against step,
//! MQAR accuracy against (T, N) per mixer, and the ranking metric against state size.
//! Text is drawn with an embedded DejaVu Sans (ab_glyph), so no system font is needed.

use std::path::{Path, PathBuf};
use std::sync::Once;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::coord::ranged1d::Ranged;
use plotters::prelude::*;

use crate::run::experiment::Metric;
use crate::run::report::Row;

const SIZE: (u32, u32) = (900, 600);

/// Draws every chart that applies into `dir`; returns the files written.
pub fn draw_all(dir: &Path, rows: &[Row], best: &[Row], metric: Metric) -> Result<Vec<PathBuf>> {
    register_font();
    let mut files = Vec::new();
    let mut both = |name: &str,
                    png: &dyn Fn(&Path) -> Result<()>,
                    svg: &dyn Fn(&Path) -> Result<()>|
     -> Result<()> {
        for (ext, draw) in [("png", png), ("svg", svg)] {
            let path = dir.join(format!("{name}.{ext}"));
            draw(&path).map_err(|e| e.context(format!("cannot draw {}", path.display())))?;
            files.push(path);
        }
        Ok(())
    };
    both(
        "validation-loss",
        &|p| curves(BitMapBackend::new(p, SIZE).into_drawing_area(), rows),
        &|p| curves(SVGBackend::new(p, SIZE).into_drawing_area(), rows),
    )?;
    if rows.iter().any(Row::is_mqar) {
        both(
            "mqar-accuracy",
            &|p| mqar(BitMapBackend::new(p, SIZE).into_drawing_area(), rows),
            &|p| mqar(SVGBackend::new(p, SIZE).into_drawing_area(), rows),
        )?;
    }
    both(
        "metric-vs-state",
        &|p| {
            state(
                BitMapBackend::new(p, SIZE).into_drawing_area(),
                best,
                metric,
            )
        },
        &|p| state(SVGBackend::new(p, SIZE).into_drawing_area(), best, metric),
    )?;
    Ok(files)
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .unwrap_or_else(|_| unreachable!("the embedded DejaVu Sans parses"));
    });
}

/// plotters' errors carry the backend's error type; keep their message.
fn fail<E: std::fmt::Debug>(error: E) -> anyhow::Error {
    anyhow!("{error:?}")
}

/// `lo..hi` widened by a margin (and made non-empty).
fn padded(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let margin = ((hi - lo) * 0.05).max(hi.abs() * 0.01).max(1e-6);
    lo - margin..hi + margin
}

fn min_max(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// The items in the order they first appear, each once.
fn distinct<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut seen = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen
}

fn color(index: usize) -> RGBColor {
    let c = Palette99::pick(index).to_rgba();
    RGBColor(c.0, c.1, c.2)
}

/// Validation loss against step, one line per run.
fn curves<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, rows: &[Row]) -> Result<()> {
    root.fill(&WHITE).map_err(fail)?;
    let steps = rows.iter().flat_map(|r| r.curve.iter().map(|&(s, _)| s));
    let max_step = steps.max().unwrap_or(1).max(1);
    let (lo, hi) =
        min_max(rows.iter().flat_map(|r| r.curve.iter().map(|&(_, v)| v))).unwrap_or((0.0, 1.0));
    let mut chart = ChartBuilder::on(&root)
        .caption("validation loss", ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0..max_step, padded(lo, hi))
        .map_err(fail)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss (nats)")
        .draw()
        .map_err(fail)?;
    for (i, row) in rows.iter().enumerate() {
        let style = color(i).stroke_width(2);
        chart
            .draw_series(LineSeries::new(row.curve.iter().copied(), style))
            .map_err(fail)?
            .label(&row.name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
    }
    legend(&mut chart)?;
    root.present().map_err(fail)
}

fn legend<'a, DB: DrawingBackend + 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(fail)
}

/// MQAR accuracy against (T, N): one line per mixer (and width, when several), the best
/// run of each point (e.g. over learning rates).
fn mqar<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, rows: &[Row]) -> Result<()> {
    root.fill(&WHITE).map_err(fail)?;
    let mqar: Vec<&Row> = rows.iter().filter(|r| r.is_mqar()).collect();
    let mut settings: Vec<(usize, usize)> = mqar
        .iter()
        .map(|r| (r.seq_len, r.kv_pairs.unwrap_or(0)))
        .collect();
    settings.sort_unstable();
    settings.dedup();
    let widths = mqar
        .iter()
        .map(|r| r.d_model)
        .collect::<std::collections::BTreeSet<_>>();
    let series_of = |r: &Row| {
        if widths.len() > 1 {
            format!("{} d{}", r.mixer, r.d_model)
        } else {
            r.mixer.clone()
        }
    };
    let names = distinct(mqar.iter().map(|r| series_of(r)));
    let labels: Vec<String> = settings.iter().map(|(t, n)| format!("T{t} N{n}")).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption("MQAR accuracy", ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        // A segmented 0..k has k + 1 segments (both ends are values).
        .build_cartesian_2d(
            (0..settings.len().saturating_sub(1)).into_segmented(),
            0.0..1.0,
        )
        .map_err(fail)?;
    chart
        .configure_mesh()
        .x_desc("(T, N)")
        .y_desc("accuracy")
        .x_labels(settings.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(fail)?;
    for (i, name) in names.iter().enumerate() {
        let points: Vec<(SegmentValue<usize>, f64)> = settings
            .iter()
            .enumerate()
            .filter_map(|(x, setting)| {
                let best = mqar
                    .iter()
                    .filter(|r| {
                        series_of(r) == *name && (r.seq_len, r.kv_pairs.unwrap_or(0)) == *setting
                    })
                    .filter_map(|r| r.final_accuracy)
                    .reduce(f64::max)?;
                Some((SegmentValue::CenterOf(x), best))
            })
            .collect();
        let style = color(i).stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.clone(), style).point_size(4))
            .map_err(fail)?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
    }
    legend(&mut chart)?;
    root.present().map_err(fail)
}

/// The ranking metric against state floats (log scale), one point per run, coloured by
/// mixer.
fn state<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    rows: &[Row],
    metric: Metric,
) -> Result<()> {
    root.fill(&WHITE).map_err(fail)?;
    let points: Vec<(&Row, f64, f64)> = rows
        .iter()
        .filter_map(|r| Some((r, r.state_floats.max(1) as f64, r.metric(metric)?)))
        .collect();
    let (x_lo, x_hi) = min_max(points.iter().map(|p| p.1)).unwrap_or((1.0, 10.0));
    let (y_lo, y_hi) = min_max(points.iter().map(|p| p.2)).unwrap_or((0.0, 1.0));
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{} against state size", metric.name()),
            ("sans-serif", 24),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_lo / 2.0..x_hi * 2.0).log_scale(), padded(y_lo, y_hi))
        .map_err(fail)?;
    chart
        .configure_mesh()
        .x_desc("state floats per sequence (log)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc(metric.name())
        .draw()
        .map_err(fail)?;
    let mixers = distinct(points.iter().map(|p| p.0.mixer.as_str()));
    for (i, mixer) in mixers.iter().enumerate() {
        let style = color(i).filled();
        let mine = points.iter().filter(|p| p.0.mixer == *mixer);
        chart
            .draw_series(mine.map(|&(_, x, y)| Circle::new((x, y), 5, style)))
            .map_err(fail)?
            .label(*mixer)
            .legend(move |(x, y)| Circle::new((x + 8, y), 5, style));
    }
    legend(&mut chart)?;
    root.present().map_err(fail)
}

/// One named line of a log-log chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// How the y axis of a line chart is scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YScale {
    Linear,
    Log,
}

/// A line chart with a log x axis (e.g. benchmark time against sequence length, or loss
/// against position) as `<name>.png` and `<name>.svg` in `dir`; returns the files written.
pub fn log_x(
    dir: &Path,
    name: &str,
    title: &str,
    axes: (&str, &str),
    series: &[Series],
    y: YScale,
) -> Result<Vec<PathBuf>> {
    register_font();
    let png = dir.join(format!("{name}.png"));
    let svg = dir.join(format!("{name}.svg"));
    let draw_png = || {
        log_x_on(
            BitMapBackend::new(&png, SIZE).into_drawing_area(),
            title,
            axes,
            series,
            y,
        )
    };
    draw_png().map_err(|e| e.context(format!("cannot draw {}", png.display())))?;
    log_x_on(
        SVGBackend::new(&svg, SIZE).into_drawing_area(),
        title,
        axes,
        series,
        y,
    )
    .map_err(|e| e.context(format!("cannot draw {}", svg.display())))?;
    Ok(vec![png, svg])
}

fn log_x_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[Series],
    y: YScale,
) -> Result<()> {
    root.fill(&WHITE).map_err(fail)?;
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (x_lo, x_hi) = min_max(all().map(|p| p.0)).unwrap_or((1.0, 10.0));
    let (y_lo, y_hi) = min_max(all().map(|p| p.1)).unwrap_or((1.0, 10.0));
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    let x = (x_lo / 1.2..x_hi * 1.2).log_scale();
    match y {
        YScale::Log => {
            let chart = builder
                .build_cartesian_2d(x, (y_lo / 1.5..y_hi * 1.5).log_scale())
                .map_err(fail)?;
            lines(chart, (x_desc, y_desc), series)?;
        }
        YScale::Linear => {
            let chart = builder
                .build_cartesian_2d(x, padded(y_lo, y_hi))
                .map_err(fail)?;
            lines(chart, (x_desc, y_desc), series)?;
        }
    }
    root.present().map_err(fail)
}

/// Each series as a line with its points, and the legend.
fn lines<'a, DB: DrawingBackend + 'a, X, Y>(
    mut chart: ChartContext<'a, DB, Cartesian2d<X, Y>>,
    (x_desc, y_desc): (&str, &str),
    series: &[Series],
) -> Result<()>
where
    X: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc(y_desc)
        .draw()
        .map_err(fail)?;
    for (i, s) in series.iter().enumerate() {
        let style = color(i).stroke_width(2);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(fail)?
            .label(&s.name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, style.filled())))
            .map_err(fail)?;
    }
    legend(&mut chart)
}
