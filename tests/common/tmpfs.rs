//! What the tests that need root share: commands run as root, and a small filesystem that
//! runs out of space for the tests of full disks (a tmpfs mounted for the test). Root, or
//! `sudo` that asks no password, as `scripts/test` does to install what the suite needs.
// Each test binary uses a part of these helpers.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted on a directory, unmounted when dropped.
pub(crate) struct Tmpfs {
    path: PathBuf,
    _fresh: Option<tempfile::TempDir>,
}

/// Runs a command as root: directly, or through password-less sudo.
pub(crate) fn as_root(args: &[&str]) -> std::process::Output {
    let root = rustix::process::geteuid().is_root();
    let mut command = if root {
        Command::new(args[0])
    } else {
        let mut sudo = Command::new("sudo");
        sudo.arg("-n").arg(args[0]);
        sudo
    };
    command
        .args(&args[1..])
        .output()
        .expect("run a command as root")
}

impl Tmpfs {
    /// A tmpfs of `size` (`mount`'s spelling: `8m`) on a fresh directory.
    pub(crate) fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let mut tmpfs = Tmpfs::mount_on(dir.path(), size);
        tmpfs._fresh = Some(dir);
        tmpfs
    }

    /// A tmpfs of `size` on `path` (created if missing).
    pub(crate) fn mount_on(path: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let text = path.to_str().unwrap().to_string();
        let output = as_root(&[
            "mount",
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size}"),
            "tmpfs",
            &text,
        ]);
        assert!(
            output.status.success(),
            "mounting a tmpfs needs root or password-less sudo: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        if !rustix::process::geteuid().is_root() {
            as_root(&["chmod", "777", &text]);
        }
        Tmpfs {
            path: path.to_path_buf(),
            _fresh: None,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = as_root(&["umount", "-l", self.path.to_str().unwrap()]);
    }
}

/// Fills what is left of the filesystem at `dir` with a file; returns its path.
pub(crate) fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("ballast");
    let mut file = std::fs::File::create(&path).unwrap();
    // Down to the last byte: a page left free would hold a new segment's header.
    for size in [64 * 1024, 4096, 1] {
        let chunk = vec![0u8; size];
        while file.write_all(&chunk).is_ok() {}
    }
    let _ = file.sync_all();
    path
}
