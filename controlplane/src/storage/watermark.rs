//! An independent record of how far the Raft log was durable.
//!
//! The log's files check every record (`log_files`), but a log cut short at its end (a
//! file truncated by a broken disk or by hand) looks like a log that simply ends there,
//! which would silently drop entries this node had acknowledged. The watermark file,
//! written beside the log after its syncs, lets start-up notice that the log lost entries
//! it had reported durable, and refuse to start instead of rejoining with a shortened log.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const FILE: &str = "LOG_WATERMARK";
/// How often the file is rewritten at most; it lags the log by up to this much, which
/// bounds what the check can miss, and keeps an fsync per append out of the write path.
const INTERVAL: Duration = Duration::from_millis(200);

pub struct Watermark {
    path: Option<PathBuf>,
    state: Mutex<(u64, Option<Instant>)>,
}

impl Watermark {
    /// A watermark that records nothing (in-memory stores).
    pub fn disabled() -> Self {
        Self { path: None, state: Mutex::new((0, None)) }
    }

    pub fn in_dir(dir: &Path) -> Self {
        Self { path: Some(dir.join(FILE)), state: Mutex::new((0, None)) }
    }

    /// The last recorded durable log index (0 when none).
    pub fn read(&self) -> Result<u64, String> {
        let Some(path) = &self.path else { return Ok(0) };
        match fs::read_to_string(path) {
            Ok(text) => text.trim().parse::<u64>().map_err(|_| format!("{} is damaged: {text:?}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// Records that the log is durable up to `index` (rate-limited, see `INTERVAL`).
    pub fn advance(&self, index: u64) -> std::io::Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        let mut state = self.state.lock().unwrap();
        let due = state.1.is_none_or(|at| at.elapsed() >= INTERVAL);
        if index <= state.0 || !due {
            return Ok(());
        }
        let tmp = path.with_extension("tmp");
        let mut f = fs::File::create(&tmp)?;
        writeln!(f, "{index}")?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        *state = (index, Some(Instant::now()));
        Ok(())
    }

    /// After a truncation or purge the log legitimately ends lower; record that at once.
    pub fn reset_to(&self, index: u64) -> std::io::Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        let mut state = self.state.lock().unwrap();
        let tmp = path.with_extension("tmp");
        let mut f = fs::File::create(&tmp)?;
        writeln!(f, "{index}")?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        *state = (index, Some(Instant::now()));
        Ok(())
    }
}
