//! Helpers shared by the integration tests that run the `crest` binary.

use std::process::Command;

/// Runs a command to completion off the async runtime; returns (success, stdout + stderr).
pub(crate) async fn output(mut command: Command) -> (bool, String) {
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}
