//! The one way a local cluster starts a node agent: its config written beside its log.

use std::path::Path;
use std::process::Command;

use crate::process::Proc;

/// A last change to an agent's command before it starts (e.g. joining a network namespace).
pub type PrepareAgent<'a> = &'a dyn Fn(&mut Command) -> Result<(), String>;

/// Starts `bin` (a node agent) with `config` written to `dir/<name>.toml`, logging to
/// `dir/<name>.log`, with `RUST_LOG` from the environment or `info`. `prepare` changes the
/// command last (e.g. to join a network namespace).
pub fn start_agent(bin: &Path, dir: &Path, name: &str, config: &str, prepare: Option<PrepareAgent<'_>>) -> Result<Proc, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(&path).env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()));
    if let Some(prepare) = prepare {
        prepare(&mut cmd)?;
    }
    Proc::spawn(&mut cmd, &dir.join(format!("{name}.log")))
}
