//! Keeping a GPU busy until its clock has settled, before anything is timed.
//!
//! An idle GPU runs at a low clock and climbs only under sustained work: the H200 sat at
//! 345 MHz between runs, and a fresh process's encoder windows read 6.4 ms (tiny.en) and
//! 29.7 ms (small.en) against 1.73 and ~10 once warm (bench/RESULTS.md, 2026-12-03, sixth
//! session). One warm-up batch and a few timed batches (15-90 ms of work) do not cover the
//! climb, so every benchmark binary (`verbatim bench`, `kernel-lab`, `nemotron-bench`) runs
//! its own work through [`warm_up`] first and prints what it saw.

use std::time::Instant;

/// Calls a group of warm-up calls holds.
pub const GROUP: usize = 3;
/// Two groups in a row within this fraction of each other: the clock has settled.
pub const AGREE: f64 = 0.03;
/// At least this long busy before the clock counts as settled. 300 ms was too short: the
/// H200's governor can hold a mid clock for a while before it boosts, and a warm-up whose
/// groups agreed there ended at 4.0 ms a dispatch where the full clock gives 2.7 (kernel
/// lab, 2026-12-04); once boosted it falls back within ~0.3 s of idling.
pub const MIN_MS: f64 = 1000.0;
/// Give up settling after this long (the timings still run, and say so).
pub const MAX_MS: f64 = 5000.0;

/// What [`warm_up`] saw: the first call's time, the last group's time per call, how long it
/// ran, how many groups, whether two groups in a row agreed.
#[derive(Clone, Copy, Debug)]
pub struct WarmUp {
    pub first_ms: f64,
    pub last_ms: f64,
    pub elapsed_ms: f64,
    pub groups: usize,
    pub settled: bool,
}

impl WarmUp {
    /// One line for a report: how long, the first call against the last group.
    pub fn describe(&self, call: &str) -> String {
        let calls = if call.ends_with("ch") || call.ends_with('s') { format!("{call}es") } else { format!("{call}s") };
        format!(
            "{:.0} ms of {calls} until two groups of {GROUP} agreed within {:.0} %: the first {:.3} ms, the last group {:.3} ms a {call} ({} groups{})",
            self.elapsed_ms,
            AGREE * 100.0,
            self.first_ms,
            self.last_ms,
            self.groups,
            if self.settled { "" } else { "; not settled within the limit" }
        )
    }
}

/// Runs `f` (one call of real work, submitted and waited for) in groups of [`GROUP`] until
/// at least [`MIN_MS`] have passed and two groups in a row agree within [`AGREE`] (at most
/// [`MAX_MS`]). An error from `f` ends it with that error.
pub fn warm_up<E>(f: impl FnMut() -> Result<(), E>) -> Result<WarmUp, E> {
    warm_up_with(f, MIN_MS, MAX_MS, AGREE)
}

/// [`warm_up`] with its limits given.
pub fn warm_up_with<E>(mut f: impl FnMut() -> Result<(), E>, min_ms: f64, max_ms: f64, agree: f64) -> Result<WarmUp, E> {
    let start = Instant::now();
    f()?;
    let first_ms = start.elapsed().as_secs_f64() * 1e3;
    let (mut prev, mut groups) = (f64::NAN, 0);
    loop {
        let t = Instant::now();
        for _ in 0..GROUP {
            f()?;
        }
        let last_ms = t.elapsed().as_secs_f64() * 1e3 / GROUP as f64;
        groups += 1;
        let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
        let settled = (last_ms - prev).abs() <= agree * prev;
        if (settled && elapsed_ms >= min_ms) || elapsed_ms >= max_ms {
            return Ok(WarmUp { first_ms, last_ms, elapsed_ms, groups, settled });
        }
        prev = last_ms;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Slow calls first (a GPU climbing from its idle clock), then fast ones: the warm-up
    /// runs past the slow ones and stops once two groups agree.
    #[test]
    fn warm_up_waits_for_the_times_to_settle() {
        let mut calls = 0usize;
        let w = warm_up_with(
            || {
                calls += 1;
                std::thread::sleep(Duration::from_millis(if calls <= 7 { 12 } else { 3 }));
                Ok::<(), String>(())
            },
            100.0,
            5000.0,
            0.5,
        )
        .unwrap();
        assert!(w.settled, "settled");
        assert!(w.first_ms >= 12.0, "first call {} ms", w.first_ms);
        assert!(w.last_ms < 6.0, "timed past the slow calls: last group {} ms a call", w.last_ms);
        assert!(calls >= 13 && w.groups >= 4, "{calls} calls, {} groups", w.groups);
        assert!(w.elapsed_ms >= 100.0);
    }

    /// Times that never agree: the warm-up gives up at its limit and says so; an error from
    /// a call ends it with that error.
    #[test]
    fn warm_up_gives_up_at_its_limit_and_passes_errors_on() {
        let mut calls = 0usize;
        let w = warm_up_with(
            || {
                calls += 1;
                // Groups of 3 calls alternate between 3 ms and 15 ms a call.
                std::thread::sleep(Duration::from_millis(if (calls.saturating_sub(2) / GROUP) % 2 == 0 { 3 } else { 15 }));
                Ok::<(), String>(())
            },
            0.0,
            150.0,
            0.2,
        )
        .unwrap();
        assert!(!w.settled, "never settled: {} groups, last {} ms", w.groups, w.last_ms);
        assert!(w.elapsed_ms >= 150.0);
        let mut n = 0;
        let e = warm_up_with(
            || {
                n += 1;
                if n == 5 { Err(String::from("device lost")) } else { Ok(()) }
            },
            1e9,
            1e9,
            0.0,
        );
        assert_eq!(e.err().as_deref(), Some("device lost"));
        assert_eq!(n, 5);
    }
}
