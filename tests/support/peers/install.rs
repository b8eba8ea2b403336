//! Installing peers nobody here wrote at pinned versions into a cache folder, once per
//! set of versions: the integration tests' harness (`tests/support/peers.rs`) and the
//! load program (`perf/src/bin/load/peers.rs`, which includes this file by path) share
//! it, so that there is one installer.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `<cache>/<name>-<hash of specs>`, installed once by `install` (into the directory it
/// is given) under a lock, so that concurrent processes wait for one install. An error
/// says what failed, with the installer's output.
pub(crate) fn installed(
    cache: &Path,
    name: &str,
    specs: &[&str],
    install: impl FnOnce(&Path) -> Command,
) -> Result<PathBuf, String> {
    std::fs::create_dir_all(cache)
        .map_err(|e| format!("create the peer cache {}: {e}", cache.display()))?;
    let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, specs.join(" ").as_bytes());
    let dir = cache.join(format!("{name}-{}", &id.simple().to_string()[..12]));
    let done = dir.join(".installed");
    let lock = std::fs::File::create(cache.join(format!(".{name}.lock")))
        .map_err(|e| format!("create the lock file in {}: {e}", cache.display()))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("lock the peer cache {}: {e}", cache.display()))?;
    if done.exists() {
        return Ok(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let mut command = install(&dir);
    let out = command
        .output()
        .map_err(|e| format!("cannot run the installer {command:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "installing the {name} peers ({}) failed ({}): the package registry must be \
             reachable.\n--- stdout\n{}\n--- stderr\n{}",
            specs.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        ));
    }
    std::fs::write(&done, specs.join("\n"))
        .map_err(|e| format!("mark {} installed: {e}", dir.display()))?;
    Ok(dir)
}

/// The `node_modules` folder of the npm packages `specs` (`name@version`), installed
/// with `npm` into `<cache>/<name>-<hash>` by [`installed`].
pub(crate) fn node_modules(cache: &Path, name: &str, specs: &[&str]) -> Result<PathBuf, String> {
    installed(cache, name, specs, |dir| {
        let mut npm = Command::new("npm");
        npm.args(["install", "--no-audit", "--no-fund", "--no-package-lock"])
            .args(["--loglevel=error", "--prefix"])
            .arg(dir)
            .args(specs);
        npm
    })
    .map(|dir| dir.join("node_modules"))
}
