//! A private DynamoDB-compatible server (moto, from PyPI) on a free port, for the
//! DynamoDB store's tests. The pinned packages are installed once, by the first test
//! that needs them, into `<target>/tmp/moto-<version>` (a failed install fails the test
//! and names the command). Needs `python3` with `pip`.
//!
//! Self-contained (std only): the library's own unit tests include this file too.

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// What is installed, pinned: moto's DynamoDB extra and the web server moto's server
/// mode needs (`moto[server]` would add every other AWS service's dependencies,
/// about 180 MB more).
const PACKAGES: [&str; 3] = ["moto[dynamodb]==5.2.5", "flask==3.1.3", "flask-cors==6.0.5"];

/// Serves moto's WSGI app on a threaded server, one request at a time. moto checks a
/// write's condition and then writes, with no lock of its own between the two (Python
/// may switch threads there), where DynamoDB serialises the writes to an item; the race
/// tests must not pass or fail by that luck. (`moto_server` itself is this app on the
/// same threaded server, without the lock.)
const LAUNCHER: &str = r#"
import sys, threading
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()
def serialised(environ, start_response):
    with lock:
        return list(app(environ, start_response))
run_simple(sys.argv[1], int(sys.argv[2]), serialised, threaded=True)
"#;

/// A running moto server, killed by its process id on drop.
pub(crate) struct MotoServer {
    port: u16,
    child: Child,
}

impl MotoServer {
    /// Installs moto if needed, starts it on a free port of 127.0.0.1 and waits until
    /// it answers.
    pub(crate) fn start() -> Self {
        let dir = install();
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port on 127.0.0.1");
        let mut child = Command::new("python3")
            .args(["-c", LAUNCHER, "127.0.0.1", &port.to_string()])
            .env("PYTHONPATH", &dir)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto's server with python3 (is python3 installed?)");
        for _ in 0..600 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Self { port, child };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "moto's server exited at start ({status}); run it by hand to see why: PYTHONPATH={} python3 -m moto.server -p {port}",
                    dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("moto's server did not listen on 127.0.0.1:{port} within 30 s");
    }

    /// `http://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The install folder, installed (once per machine and target folder).
fn install() -> PathBuf {
    let cache = target_dir().join("tmp");
    std::fs::create_dir_all(&cache).expect("create <target>/tmp");
    let dir = cache.join("moto-5.2.5");
    let done = dir.join(".installed");
    if done.exists() {
        return dir;
    }
    // One installer at a time (test processes run in parallel): a lock file naming its
    // holder's pid (made whole, then linked into place), taken over when that process
    // is gone.
    let lock = cache.join("moto-5.2.5.lock");
    let mine = cache.join(format!("moto-5.2.5.lock.{}", std::process::id()));
    std::fs::write(&mine, std::process::id().to_string()).expect("write a lock file");
    let mut locked = false;
    for _ in 0..6000 {
        if done.exists() {
            break;
        }
        if std::fs::hard_link(&mine, &lock).is_ok() {
            locked = true;
            break;
        }
        let holder = std::fs::read_to_string(&lock).unwrap_or_default();
        if !holder.is_empty() && !Path::new("/proc").join(holder.trim()).exists() {
            let _ = std::fs::remove_file(&lock); // its holder died
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_file(&mine);
    if done.exists() {
        if locked {
            let _ = std::fs::remove_file(&lock);
        }
        return dir;
    }
    assert!(
        locked,
        "another test process held the moto install lock for 10 minutes"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--no-input", "--no-warn-script-location", "--target"])
        .arg(&dir)
        .args(PACKAGES)
        .stdin(Stdio::null())
        .output();
    let installed = out.as_ref().is_ok_and(|o| o.status.success());
    if installed {
        File::create(&done).expect("mark the moto install complete");
    }
    let _ = std::fs::remove_file(&lock);
    let out = out.expect("run python3 -m pip (are python3 and pip installed?)");
    assert!(
        installed,
        "installing {PACKAGES:?} into {} with pip failed ({}):\n{}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Cargo's target folder: test binaries run from `<target>/<profile>/deps/`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .expect("the test binary lives in <target>/<profile>/deps")
}
