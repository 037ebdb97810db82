//! What crest's tests share across its crates.
//!
//! Tests wait on conditions, never on fixed sleeps: [`eventually`] asks a condition again
//! and again until it holds, and fails the test, saying what it waited for and what it saw
//! last, once a deadline passed. A condition answers `bool`, `Option<T>` (the value once
//! there) or `Result<T, E>` (the value, or what is still missing).

use std::fmt::{Debug, Display};
use std::time::{Duration, Instant};

/// First pause between two looks at a condition; it doubles up to [`PAUSE_MAX`].
const PAUSE_FIRST: Duration = Duration::from_millis(2);
/// Longest pause between two looks at a condition.
const PAUSE_MAX: Duration = Duration::from_millis(50);

/// What a look at a condition found: [`Outcome::settled`] gives the value once it holds, or
/// what was seen instead.
pub trait Outcome {
    /// What the wait returns once the condition holds.
    type Value;
    /// The value if the condition holds, else what was seen, for the failure message.
    fn settled(self) -> Result<Self::Value, String>;
}

impl Outcome for bool {
    type Value = ();
    fn settled(self) -> Result<(), String> {
        if self { Ok(()) } else { Err("false".into()) }
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn settled(self) -> Result<T, String> {
        self.ok_or_else(|| "None".into())
    }
}

impl<T, E: Debug> Outcome for Result<T, E> {
    type Value = T;
    fn settled(self) -> Result<T, String> {
        self.map_err(|seen| format!("{seen:?}"))
    }
}

/// Looks at `check` until it holds and returns its value; panics naming `what` and the last
/// thing seen once `within` passed. The condition is looked at once more after the deadline,
/// so a slow look never fails a condition that holds.
///
/// # Panics
/// When `check` does not hold within `within`.
pub async fn eventually<O: Outcome>(
    within: Duration,
    what: impl Display,
    mut check: impl AsyncFnMut() -> O,
) -> O::Value {
    let mut looks = Looks::new(within);
    loop {
        let late = looks.late();
        if let Some(value) = looks.judge(late, &what, check().await) {
            return value;
        }
        tokio::time::sleep(looks.pause()).await;
    }
}

/// [`eventually`] for a test that has no async runtime: it sleeps the thread between looks.
///
/// # Panics
/// When `check` does not hold within `within`.
pub fn eventually_blocking<O: Outcome>(
    within: Duration,
    what: impl Display,
    mut check: impl FnMut() -> O,
) -> O::Value {
    let mut looks = Looks::new(within);
    loop {
        let late = looks.late();
        if let Some(value) = looks.judge(late, &what, check()) {
            return value;
        }
        std::thread::sleep(looks.pause());
    }
}

/// The looks of one wait: its deadline and the pause before the next look.
struct Looks {
    within: Duration,
    deadline: Instant,
    pause: Duration,
}

impl Looks {
    fn new(within: Duration) -> Self {
        Looks {
            within,
            deadline: Instant::now() + within,
            pause: PAUSE_FIRST,
        }
    }

    /// Whether the deadline passed (asked before a look, so that the look is the last).
    fn late(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// The value a look found, or `None` to look again; panics on a last look that failed.
    fn judge<O: Outcome>(&self, late: bool, what: &impl Display, found: O) -> Option<O::Value> {
        match found.settled() {
            Ok(value) => Some(value),
            Err(seen) if late => panic!("waited {:?} for {what}; last seen: {seen}", self.within),
            Err(_) => None,
        }
    }

    /// How long to wait before the next look: doubling, never past the deadline.
    fn pause(&mut self) -> Duration {
        let pause = self
            .pause
            .min(self.deadline.saturating_duration_since(Instant::now()));
        self.pause = (self.pause * 2).min(PAUSE_MAX);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_condition_that_comes_to_hold_gives_its_value() {
        let mut looks = 0;
        let value = eventually(Duration::from_secs(5), "the third look", async || {
            looks += 1;
            (looks >= 3).then_some(looks * 10)
        })
        .await;
        assert_eq!(value, 30);
    }

    #[tokio::test]
    #[should_panic(expected = "for the impossible; last seen: \"still 0\"")]
    async fn a_condition_that_never_holds_fails_naming_what_was_seen_last() {
        eventually(Duration::from_millis(30), "the impossible", async || {
            Err::<(), _>("still 0")
        })
        .await;
    }

    #[test]
    fn the_blocking_wait_looks_once_more_after_its_deadline() {
        let start = Instant::now();
        let within = Duration::from_millis(20);
        let mut looks = 0;
        eventually_blocking(within, "a late look", || {
            looks += 1;
            start.elapsed() >= within
        });
        assert!(looks >= 2, "{looks} looks");
    }
}
