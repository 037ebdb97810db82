//! Headless Chromium for the tests that render the dashboard (`.ci/run` installs it).

use std::path::PathBuf;

/// The Chromium of this machine, if it has one.
pub(crate) fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .map(|name| PathBuf::from("/usr/bin").join(name))
        .find(|path| path.exists())
}

/// A headless run of `browser` with its own profile in `profile`; add `--dump-dom URL` or
/// `--screenshot`.
pub(crate) fn headless(browser: &PathBuf, profile: &std::path::Path) -> std::process::Command {
    let mut command = std::process::Command::new(browser);
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=5000",
        "--window-size=1400,1100",
    ]);
    command.arg(format!("--user-data-dir={}", profile.display()));
    command
}
