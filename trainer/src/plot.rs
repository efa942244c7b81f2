//! `trainer plot`: a PNG of a metrics log, training loss (with validation points)
//! and learning rate against tokens.
//!
//! Text is drawn with Noto Sans compiled into the binary, so plotting needs no
//! system fonts.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::Error;
use crate::telemetry::metrics_log::{self, Record};
use crate::telemetry::progress::human_count;

/// Width of the image, pixels.
pub const WIDTH: u32 = 1200;
/// Height of the image, pixels.
pub const HEIGHT: u32 = 900;

/// Colour of the training-loss line.
pub const LOSS_COLOR: RGBColor = RGBColor(31, 119, 180);
/// Colour of the validation-loss points.
pub const VAL_COLOR: RGBColor = RGBColor(214, 39, 40);
/// Colour of the learning-rate line.
pub const LR_COLOR: RGBColor = RGBColor(44, 160, 44);

const FONT: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FONT, FontStyle::Normal, ttf_noto_sans::REGULAR).is_err() {
            panic!("the embedded Noto Sans font does not parse");
        }
    });
}

/// What a plot shows, taken from a metrics log. Points are (tokens, value).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// The run's name, from the log's last `start` or `resume` record.
    pub run: Option<String>,
    /// Training loss per step; NaN/Inf steps are left out.
    pub train_loss: Vec<(f64, f64)>,
    /// Validation loss per evaluation.
    pub val_loss: Vec<(f64, f64)>,
    /// Learning rate per step.
    pub lr: Vec<(f64, f64)>,
}

impl Series {
    /// The series of a log's records.
    pub fn from_records(records: &[Record]) -> Series {
        let mut series = Series::default();
        for record in records {
            match record {
                Record::Start(r) if r.run.is_some() => series.run.clone_from(&r.run),
                Record::Resume(r) if r.run.is_some() => series.run.clone_from(&r.run),
                Record::Step(r) => {
                    let x = r.tokens as f64;
                    if r.loss.is_finite() {
                        series.train_loss.push((x, r.loss));
                    }
                    if r.lr.is_finite() {
                        series.lr.push((x, r.lr));
                    }
                }
                Record::Eval(r) if r.val_loss.is_finite() => series.val_loss.push((r.tokens as f64, r.val_loss)),
                _ => {}
            }
        }
        series
    }
}

/// The default image of a log: beside it, `<stem>.png`.
pub fn default_output(log: &Path) -> PathBuf {
    log.with_extension("png")
}

/// Plots the log at `log` into `out` (default: [`default_output`]) and returns the
/// image's path.
pub fn plot_file(log: &Path, out: Option<&Path>) -> Result<PathBuf, Error> {
    let records = metrics_log::read(log)?;
    let series = Series::from_records(&records);
    if series.train_loss.is_empty() {
        return Err(Error::Plot { path: log.to_path_buf(), message: "the log has no step with a finite loss".into() });
    }
    let out = out.map_or_else(|| default_output(log), Path::to_path_buf);
    let title = series.run.clone().unwrap_or_else(|| log.display().to_string());
    plot(&series, &title, &out)?;
    Ok(out)
}

/// Draws `series` under `title` into the PNG `out`.
pub fn plot(series: &Series, title: &str, out: &Path) -> Result<(), Error> {
    let root = BitMapBackend::new(out, (WIDTH, HEIGHT)).into_drawing_area();
    draw(&root, series, title)
        .and_then(|()| root.present().map_err(|e| e.to_string()))
        .map_err(|message| Error::Plot { path: out.to_path_buf(), message })
}

/// (min, max) of the values, widened when they are all equal.
fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = if hi > lo { (hi - lo) * 0.05 } else { lo.abs().max(1.0) * 0.05 };
    (lo - pad, hi + pad)
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, series: &Series, title: &str) -> Result<(), String> {
    register_font();
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let body = root.titled(title, (FONT, 30)).map_err(err)?;
    let (upper, lower) = body.split_vertically(body.dim_in_pixel().1 * 62 / 100);

    // Token counts are never negative: no padding below 0.
    let (x0, x1) = range(series.train_loss.iter().chain(&series.val_loss).chain(&series.lr).map(|p| p.0));
    let x0 = x0.max(0.0);
    let x_label = |x: &f64| human_count(*x);

    let (y0, y1) = range(series.train_loss.iter().chain(&series.val_loss).map(|p| p.1));
    let mut loss = ChartBuilder::on(&upper)
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    loss.configure_mesh()
        .x_desc("tokens")
        .y_desc("loss")
        .x_label_formatter(&x_label)
        .label_style((FONT, 16))
        .draw()
        .map_err(err)?;
    loss.draw_series(LineSeries::new(series.train_loss.iter().copied(), LOSS_COLOR.stroke_width(2)))
        .map_err(err)?
        .label("train loss")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], LOSS_COLOR.stroke_width(2)));
    if !series.val_loss.is_empty() {
        loss.draw_series(series.val_loss.iter().map(|&p| Circle::new(p, 5, VAL_COLOR.filled())))
            .map_err(err)?
            .label("val loss")
            .legend(|(x, y)| Circle::new((x + 10, y), 5, VAL_COLOR.filled()));
    }
    loss.configure_series_labels()
        .label_font((FONT, 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;

    let (_, lr_max) = range(series.lr.iter().map(|p| p.1));
    let mut lr = ChartBuilder::on(&lower)
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, 0.0..lr_max.max(f64::MIN_POSITIVE))
        .map_err(err)?;
    lr.configure_mesh()
        .x_desc("tokens")
        .y_desc("learning rate")
        .x_label_formatter(&x_label)
        .y_label_formatter(&|y: &f64| format!("{y:.1e}"))
        .label_style((FONT, 16))
        .draw()
        .map_err(err)?;
    lr.draw_series(LineSeries::new(series.lr.iter().copied(), LR_COLOR.stroke_width(2))).map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crds::types::CheckpointRef;

    use super::*;
    use crate::telemetry::metrics_log::MetricsLog;
    use crate::train::report::StepReport;

    fn tempdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("trainer-plot-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write_log(dir: &Path) -> PathBuf {
        let mut log = MetricsLog::open(dir, 0, 0, Some("tiny-local"), 1).unwrap();
        for step in 1..=200u64 {
            let warm = (step as f64 / 20.0).min(1.0);
            let report = StepReport {
                step,
                tokens: step * 4096,
                loss: 2.0 + 8.0 / (1.0 + step as f64 / 10.0),
                lr: 3e-4 * warm,
                grad_norm: 1.0,
                tokens_per_second: 1e4,
                mfu: None,
                grpo: None,
                gpu_memory: None,
                tokens_by_source: Vec::new(),
            };
            log.step(&report).unwrap();
            if step % 50 == 0 {
                log.eval(step, step * 4096, 2.3 + 6.0 / (1.0 + step as f64 / 10.0), &[]).unwrap();
                log.checkpoint(&CheckpointRef {
                    step,
                    tokens: step * 4096,
                    uri: "c".into(),
                    time: None,
                    val_loss: None,
                })
                .unwrap();
            }
        }
        log.path().to_path_buf()
    }

    #[test]
    fn series_come_from_step_and_eval_records() {
        let dir = tempdir("series");
        let series = Series::from_records(&metrics_log::read(&write_log(&dir)).unwrap());
        assert_eq!(series.run.as_deref(), Some("tiny-local"));
        assert_eq!(series.train_loss.len(), 200);
        assert_eq!(series.lr.len(), 200);
        assert_eq!(series.val_loss.len(), 4);
        assert_eq!(series.val_loss[0].0, 50.0 * 4096.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn plot_writes_a_png_beside_the_log() {
        let dir = tempdir("png");
        let log = write_log(&dir);
        let out = plot_file(&log, None).unwrap();
        assert_eq!(out, dir.join("metrics.png"));
        let png = std::fs::read(&out).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
        let h = u32::from_be_bytes(png[20..24].try_into().unwrap());
        assert_eq!((w, h), (WIDTH, HEIGHT));
        // A blank white 1200x900 image compresses to a few kilobytes.
        assert!(png.len() > 20_000, "{} bytes", png.len());

        let custom = dir.join("custom.png");
        assert_eq!(plot_file(&log, Some(&custom)).unwrap(), custom);
        assert!(custom.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_image_shows_lines_points_and_text() {
        let dir = tempdir("pixels");
        let series = Series::from_records(&metrics_log::read(&write_log(&dir)).unwrap());
        let (w, h) = (WIDTH as usize, HEIGHT as usize);
        let mut buf = vec![0u8; w * h * 3];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
            draw(&root, &series, "tiny-local").unwrap();
            root.present().unwrap();
        }
        let count = |c: RGBColor| buf.chunks(3).filter(|p| p == &[c.0, c.1, c.2]).count();
        assert!(count(LOSS_COLOR) > 500, "loss line: {} pixels", count(LOSS_COLOR));
        assert!(count(VAL_COLOR) > 4 * 50, "val points: {} pixels", count(VAL_COLOR));
        assert!(count(LR_COLOR) > 500, "lr line: {} pixels", count(LR_COLOR));
        // The title is rendered text: dark pixels in the top band, which holds nothing else.
        let dark_in_title = buf[..w * 3 * 36].chunks(3).filter(|p| p.iter().all(|&v| v < 100)).count();
        assert!(dark_in_title > 50, "title: {dark_in_title} dark pixels");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_empty_and_bad_logs_name_the_file() {
        let dir = tempdir("bad");
        let missing = dir.join("nope.jsonl");
        let err = plot_file(&missing, None).unwrap_err();
        assert!(matches!(err, Error::Io { .. }) && err.to_string().contains("nope.jsonl"), "{err}");

        let bad = dir.join("bad.jsonl");
        std::fs::write(&bad, "{\"kind\":\"step\"\n").unwrap();
        let err = plot_file(&bad, None).unwrap_err();
        assert!(err.to_string().contains(&format!("{}:1:", bad.display())), "{err}");

        let empty = dir.join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        let err = plot_file(&empty, None).unwrap_err();
        assert!(matches!(err, Error::Plot { .. }) && err.to_string().contains("empty.jsonl"), "{err}");
        assert!(!dir.join("empty.png").exists());

        let log = write_log(&dir);
        let err = plot_file(&log, Some(&dir.join("no-such-dir/out.png"))).unwrap_err();
        assert!(err.to_string().contains("no-such-dir/out.png"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
