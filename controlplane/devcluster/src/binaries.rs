//! Where the binaries a local cluster runs are.

use std::path::{Path, PathBuf};

/// The controller, node-agent and sim-infer binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub controlplane: PathBuf,
    pub node_agent: PathBuf,
    pub sim_infer: PathBuf,
}

impl Binaries {
    /// The binaries in `dir` (a cargo target profile directory), named `who` in errors.
    pub fn in_dir(dir: &Path, who: &str) -> Result<Binaries, String> {
        let find = |name: &str| {
            let path = dir.join(name);
            if path.exists() {
                Ok(path)
            } else {
                Err(format!(
                    "{} not found: {who} runs the controlplane, node-agent and sim-infer binaries next to itself \
                     (build them all with `cargo build --release`)",
                    path.display()
                ))
            }
        };
        Ok(Binaries { controlplane: find("controlplane")?, node_agent: find("node-agent")?, sim_infer: find("sim-infer")? })
    }

    /// The binaries next to the running program (`gpuctl`, `chaos`, a benchmark).
    pub fn beside_current_exe(who: &str) -> Result<Binaries, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot locate {who}: {e}"))?;
        let dir = exe.parent().ok_or(format!("{who} has no parent directory"))?;
        Binaries::in_dir(dir, who)
    }
}
