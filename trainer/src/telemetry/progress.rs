//! Progress on rank 0: a progress bar over the token budget when stdout is a
//! terminal, otherwise one plain log line every N steps or every interval, whichever
//! comes first. Also the process's `tracing` set-up, [`init_logging`].

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::Error;
use crate::dist::launch::FORCE_COLOR_ENV;
use crate::train::report::{Event, Sink, StepReport};

/// The AWS SDK's crates print their request context, credentials included (the
/// access key id in clear), at debug level: they never log below info, whatever
/// `RUST_LOG` asks. Their warnings and errors still show.
const AWS_SDK_TARGETS: [&str; 9] = [
    "aws_config",
    "aws_credential_types",
    "aws_runtime",
    "aws_sdk_s3",
    "aws_sdk_sso",
    "aws_sdk_sts",
    "aws_sigv4",
    "aws_smithy_runtime",
    "aws_smithy_runtime_api",
];

/// Sets up `tracing` for the process: `RUST_LOG` filters (default `info`), lines go
/// to stderr (the AWS SDK's at most at info), coloured only when stderr is a terminal (or `CLICOLOR_FORCE` is set and
/// not "0"). A second call does nothing.
pub fn init_logging() {
    let forced = std::env::var(FORCE_COLOR_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    for target in AWS_SDK_TARGETS {
        filter = filter.add_directive(format!("{target}=info").parse().expect("a valid directive"));
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(forced || std::io::stderr().is_terminal())
        .try_init();
}

/// How often plain (non-terminal) progress lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgressConfig {
    /// Write a line at least every this many steps.
    pub log_every_steps: u64,
    /// Write a line when this much time has passed since the last one.
    pub log_interval: Duration,
}

impl Default for ProgressConfig {
    fn default() -> Self {
        ProgressConfig { log_every_steps: 100, log_interval: Duration::from_secs(10) }
    }
}

enum Output {
    Bar(ProgressBar),
    Log,
    #[cfg(test)]
    Capture(Vec<String>),
}

/// Progress display of one training attempt.
pub struct Progress {
    total_steps: u64,
    total_tokens: u64,
    config: ProgressConfig,
    sink: Output,
    last_logged_step: u64,
    last_logged_at: Instant,
    /// Exponential moving average of tokens per second, for the ETA.
    rate: Option<f64>,
    last: Option<StepReport>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("total_steps", &self.total_steps)
            .field("total_tokens", &self.total_tokens)
            .field("tty", &matches!(self.sink, Output::Bar(_)))
            .finish()
    }
}

impl Progress {
    /// Progress of a run of `total_steps` steps and `total_tokens` tokens, resumed at
    /// `start_step` (0 for a fresh run). `is_tty` chooses the bar (`true`) or plain
    /// lines (`false`); `None` asks whether stdout is a terminal.
    pub fn new(total_steps: u64, total_tokens: u64, start_step: u64, is_tty: Option<bool>) -> Progress {
        Progress::with_config(total_steps, total_tokens, start_step, is_tty, ProgressConfig::default())
    }

    /// [`Progress::new`] with a plain-line cadence.
    pub fn with_config(
        total_steps: u64,
        total_tokens: u64,
        start_step: u64,
        is_tty: Option<bool>,
        config: ProgressConfig,
    ) -> Progress {
        let tty = is_tty.unwrap_or_else(|| std::io::stdout().is_terminal());
        let sink = if tty {
            let bar = ProgressBar::with_draw_target(Some(total_tokens), ProgressDrawTarget::stdout());
            let style =
                ProgressStyle::with_template("{bar:30.cyan/blue} {percent:>3}% {human_pos}/{human_len} tok  {msg}")
                    .expect("valid progress template")
                    .progress_chars("=> ");
            bar.set_style(style);
            if start_step > 0 && total_steps > 0 {
                bar.set_position(total_tokens / total_steps * start_step);
            }
            Output::Bar(bar)
        } else {
            Output::Log
        };
        Progress {
            total_steps,
            total_tokens,
            config,
            sink,
            last_logged_step: start_step,
            last_logged_at: Instant::now(),
            rate: None,
            last: None,
        }
    }

    /// Shows a completed step: on the bar at once, as a plain line when one is due.
    pub fn on_step(&mut self, report: &StepReport) {
        self.on_step_at(report, Instant::now());
    }

    fn on_step_at(&mut self, report: &StepReport, now: Instant) {
        if report.tokens_per_second.is_finite() && report.tokens_per_second > 0.0 {
            let r = report.tokens_per_second;
            self.rate = Some(self.rate.map_or(r, |old| 0.9 * old + 0.1 * r));
        }
        let first = self.last.replace(report.clone()).is_none();
        if let Output::Bar(bar) = &self.sink {
            bar.set_position(report.tokens.min(self.total_tokens));
            bar.set_message(self.message(report));
            return;
        }
        if first || self.due(report.step, now) {
            self.last_logged_step = report.step;
            self.last_logged_at = now;
            let line = format!(
                "step {}/{} {}/{} tok ({:.1}%) {}",
                report.step,
                self.total_steps,
                human_count(report.tokens as f64),
                human_count(self.total_tokens as f64),
                percent(report.tokens, self.total_tokens),
                self.message(report)
            );
            self.emit(line);
        }
    }

    /// Whether a plain line is due at `step` (besides the first step shown): every
    /// `log_every_steps`, at the last step, or `log_interval` after the previous line.
    fn due(&self, step: u64, now: Instant) -> bool {
        step >= self.total_steps
            || step >= self.last_logged_step + self.config.log_every_steps.max(1)
            || now.duration_since(self.last_logged_at) >= self.config.log_interval
    }

    /// Loss, lr, throughput, MFU and ETA of a step.
    fn message(&self, report: &StepReport) -> String {
        let mut msg =
            format!("loss {:.4} lr {:.2e} {}/s", report.loss, report.lr, human_count(report.tokens_per_second));
        if let Some(g) = &report.grpo {
            msg.push_str(&format!(
                " reward {:.3} acc {:.1}% kl {:.4} len {:.1} flat {:.0}% H {:.2}",
                g.reward,
                100.0 * g.accuracy,
                g.kl,
                g.completion_length,
                100.0 * g.frac_reward_zero_std,
                g.entropy
            ));
        }
        if let Some(mfu) = report.mfu {
            msg.push_str(&format!(" mfu {:.1}%", mfu * 100.0));
        }
        if let Some(g) = report.gpu_memory {
            msg.push_str(&format!(" mem {:.1}/{:.0} GiB", g.peak_gib(), g.total_gib()));
        }
        if let Some(rate) = self.rate {
            let left = self.total_tokens.saturating_sub(report.tokens) as f64 / rate;
            msg.push_str(&format!(" eta {}", human_duration(left)));
        }
        msg
    }

    /// Shows an evaluation: the mean validation loss, its perplexity and each source's loss.
    pub fn on_eval(&mut self, step: u64, val_loss: f64, per_source: &[(String, f64)]) {
        let mut line = format!("eval step {step}: val loss {val_loss:.4} ppl {:.2}", val_loss.exp());
        for (source, loss) in per_source {
            line.push_str(&format!(" {source} {loss:.4}"));
        }
        self.emit(line);
    }

    /// Prints a line (above the bar when there is one).
    pub fn println(&mut self, msg: impl AsRef<str>) {
        self.emit(msg.as_ref().to_owned());
    }

    fn emit(&mut self, line: String) {
        match &mut self.sink {
            Output::Bar(bar) => bar.println(line),
            Output::Log => tracing::info!("{line}"),
            #[cfg(test)]
            Output::Capture(lines) => lines.push(line),
        }
    }

    fn summary(&self) -> String {
        match &self.last {
            Some(r) => format!(
                "finished at step {}/{}: {} tokens, loss {:.4}",
                r.step,
                self.total_steps,
                human_count(r.tokens as f64),
                r.loss
            ),
            None => "finished: no step run".to_owned(),
        }
    }

    /// Ends the display with a summary of the last step.
    pub fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        let summary = self.summary();
        match &mut self.sink {
            Output::Bar(bar) => bar.finish_with_message(summary),
            _ => self.emit(summary),
        }
    }
}

impl Sink for Progress {
    fn record(&mut self, event: &Event) -> Result<(), Error> {
        match *event {
            Event::Started(start) => {
                let cfg = start.cfg;
                self.println(format!(
                    "{}: {} ({} params) on {}, {} steps of {} tokens; {}",
                    cfg.name,
                    cfg.model.preset,
                    human_count(cfg.params.total as f64),
                    cfg.topology.display,
                    cfg.schedule.total_steps,
                    cfg.batch.tokens_per_step,
                    start.data,
                ));
            }
            Event::Step(report) => self.on_step(report),
            Event::Eval { step, val_loss, per_source, .. } => self.on_eval(step, val_loss, per_source),
            Event::Accuracy { step, set, score, initial, .. } => self.println(format!(
                "{} accuracy on {} {} questions after {} steps: {:.1}% greedy answer letter, {:.1}% by log-likelihood ({:.1}% unanswered)",
                if initial { "initial" } else { "final" },
                score.all.questions,
                set,
                step,
                100.0 * score.all.greedy,
                100.0 * score.all.acc,
                100.0 * score.all.unparsed,
            )),
            Event::Sample { step, prompt, text, .. } => {
                self.println(format!("sample after {step} steps:\n{prompt} {text}"))
            }
            Event::Phase(_) | Event::Checkpoint(_) | Event::Best(_) | Event::Ranks(_) | Event::NonFinite { .. } | Event::Failure(_) => {}
        }
        Ok(())
    }

    fn finish(&mut self) {
        self.end();
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 { 100.0 } else { part as f64 * 100.0 / whole as f64 }
}

/// 1234 → "1.2K", 8_200_000 → "8.2M"; values under 1000 as they are.
pub fn human_count(v: f64) -> String {
    const UNITS: [(f64, &str); 4] = [(1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")];
    if !v.is_finite() {
        return format!("{v}");
    }
    for (scale, unit) in UNITS {
        if v.abs() >= scale {
            return format!("{:.1}{unit}", v / scale);
        }
    }
    format!("{v:.0}")
}

/// Seconds as "2d03h", "1h02m", "3m05s" or "12s".
pub fn human_duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "?".to_owned();
    }
    let s = seconds.round() as u64;
    let (d, h, m, s) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    match () {
        _ if d > 0 => format!("{d}d{h:02}h"),
        _ if h > 0 => format!("{h}h{m:02}m"),
        _ if m > 0 => format!("{m}m{s:02}s"),
        _ => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(total_steps: u64, start_step: u64, config: ProgressConfig) -> Progress {
        let mut p = Progress::with_config(total_steps, total_steps * 1000, start_step, Some(false), config);
        p.sink = Output::Capture(Vec::new());
        p
    }

    fn lines(p: &Progress) -> &[String] {
        match &p.sink {
            Output::Capture(lines) => lines,
            _ => unreachable!(),
        }
    }

    fn report(step: u64) -> StepReport {
        StepReport {
            step,
            tokens: step * 1000,
            loss: 2.5,
            lr: 3e-4,
            grad_norm: 1.0,
            tokens_per_second: 1000.0,
            mfu: Some(0.5),
            grpo: None,
            gpu_memory: None,
            tokens_by_source: Vec::new(),
        }
    }

    #[test]
    fn plain_lines_every_n_steps_plus_first_and_last() {
        let hour = Duration::from_secs(3600);
        let mut p = captured(25, 0, ProgressConfig { log_every_steps: 10, log_interval: hour });
        let t0 = Instant::now();
        for s in 1..=25 {
            p.on_step_at(&report(s), t0);
        }
        let steps: Vec<&str> = lines(&p).iter().map(|l| l.split(' ').nth(1).unwrap()).collect();
        assert_eq!(steps, ["1/25", "11/25", "21/25", "25/25"]);
        assert_eq!(lines(&p)[1], "step 11/25 11.0K/25.0K tok (44.0%) loss 2.5000 lr 3.00e-4 1.0K/s mfu 50.0% eta 14s");
    }

    #[test]
    fn a_cuda_step_shows_its_peak_gpu_memory() {
        let mut p = captured(10, 0, ProgressConfig { log_every_steps: 1, log_interval: Duration::from_secs(3600) });
        let g = crate::train::report::GpuMemory { peak_bytes: 45 << 29, total_bytes: 80 << 30 };
        p.on_step_at(&StepReport { gpu_memory: Some(g), ..report(1) }, Instant::now());
        assert!(lines(&p)[0].contains(" mfu 50.0% mem 22.5/80 GiB eta "), "{}", lines(&p)[0]);
    }

    #[test]
    fn plain_lines_when_the_interval_passes_first() {
        let mut p = captured(1000, 100, ProgressConfig { log_every_steps: 500, log_interval: Duration::from_secs(10) });
        let t0 = Instant::now();
        p.on_step_at(&report(101), t0);
        p.on_step_at(&report(102), t0 + Duration::from_secs(5));
        p.on_step_at(&report(103), t0 + Duration::from_secs(11));
        p.on_step_at(&report(104), t0 + Duration::from_secs(12));
        p.on_step_at(&report(105), t0 + Duration::from_secs(21));
        let steps: Vec<&str> = lines(&p).iter().map(|l| l.split(' ').nth(1).unwrap()).collect();
        assert_eq!(steps, ["101/1000", "103/1000", "105/1000"]);
    }

    #[test]
    fn eval_println_and_finish_lines() {
        let mut p = captured(10, 0, ProgressConfig::default());
        p.on_eval(10, 2.0, &[("web".into(), 1.5), ("code".into(), 2.5)]);
        p.println("saved checkpoint");
        assert_eq!(lines(&p), ["eval step 10: val loss 2.0000 ppl 7.39 web 1.5000 code 2.5000", "saved checkpoint"]);
        assert_eq!(p.summary(), "finished: no step run");
        p.on_step_at(&report(10), Instant::now());
        assert_eq!(p.summary(), "finished at step 10/10: 10.0K tokens, loss 2.5000");
    }

    #[test]
    fn human_formats() {
        assert_eq!(human_count(999.0), "999");
        assert_eq!(human_count(1234.0), "1.2K");
        assert_eq!(human_count(8.2e6), "8.2M");
        assert_eq!(human_count(1.5e9), "1.5B");
        assert_eq!(human_duration(12.4), "12s");
        assert_eq!(human_duration(185.0), "3m05s");
        assert_eq!(human_duration(3720.0), "1h02m");
        assert_eq!(human_duration(2.0 * 86400.0 + 3.0 * 3600.0), "2d03h");
        assert_eq!(human_duration(f64::INFINITY), "?");
    }

    #[test]
    fn the_bar_tracks_tokens_without_logging() {
        let mut p = Progress::new(10, 10_000, 2, Some(true));
        let Output::Bar(bar) = &p.sink else { panic!("expected a bar") };
        assert_eq!(bar.position(), 2000);
        p.on_step(&report(3));
        let Output::Bar(bar) = &p.sink else { unreachable!() };
        assert_eq!(bar.position(), 3000);
        assert!(bar.message().starts_with("loss 2.5000 lr 3.00e-4 1.0K/s mfu 50.0% eta 7s"), "{}", bar.message());
        p.finish();
    }
}
