//! Host work spread over the machine's cores: [`side_by_side`] and how many threads.

use crate::{Error, Result};

/// Worker threads for `n` cores: the cores, at most 16, at least 1.
fn workers(cores: Option<usize>) -> usize {
    cores.unwrap_or(1).clamp(1, 16)
}

/// Threads to work on here (`workers` of this machine's cores): the kernels a load compiles
/// (gpu/compile.rs), and what [`side_by_side`] runs.
pub(crate) fn threads() -> usize {
    workers(std::thread::available_parallelism().ok().map(|n| n.get()))
}

/// Worker threads started once, [`threads`] of them, for work that comes often and in small
/// pieces (a file's spectrogram: ~3 µs a frame, ~9 ms for 30 s on one core of the lent
/// machines), where starting threads for each piece costs more than the piece there (jfk's
/// spectrogram 2.0-3.8 ms on 5 new threads, 4.3-11.3 on 16; bench/RESULTS.md, twenty-sixth
/// session). None where the system refuses the threads: callers then work on their own
/// thread.
pub(crate) fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| rayon::ThreadPoolBuilder::new().num_threads(threads()).thread_name(|i| format!("verbatim-pool-{i}")).build().ok())
        .as_ref()
}

/// `f(0)`, ..., `f(n - 1)` on up to [`threads`] threads, each taking the next index
/// as it finishes one; the results in index order. The replay's raw pipelines are built
/// this way, a model's weights are prepared (copied, transposed) and uploaded so, and a
/// long input is resampled in runs of chunks so.
pub(crate) fn side_by_side<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Result<Vec<T>> {
    if n <= 1 {
        return Ok((0..n).map(f).collect());
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: Vec<Vec<(usize, T)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads().min(n))
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= n {
                            break out;
                        }
                        out.push((i, f(i)));
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().map_err(|_| Error::Gpu("a worker thread panicked".into()))).collect::<Result<_>>()
    })?;
    let mut all: Vec<(usize, T)> = done.into_iter().flatten().collect();
    all.sort_by_key(|(i, _)| *i);
    Ok(all.into_iter().map(|(_, t)| t).collect())
}

/// `f(i, piece)` for every piece of `data` cut into pieces of `len` (the last may be
/// shorter), on up to [`threads`] threads, each taking the next piece as it finishes one:
/// a long file's samples are converted and mixed down so, each value computed as one
/// thread would.
pub(crate) fn pieces_side_by_side<T: Send>(data: &mut [T], len: usize, f: impl Fn(usize, &mut [T]) + Sync) -> Result<()> {
    // Each piece behind a lock of its own, taken once by the worker its index goes to.
    let pieces: Vec<std::sync::Mutex<&mut [T]>> = data.chunks_mut(len.max(1)).map(std::sync::Mutex::new).collect();
    side_by_side(pieces.len(), |i| f(i, &mut pieces[i].lock().unwrap_or_else(|p| p.into_inner())))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{pieces_side_by_side, side_by_side, workers};
    use crate::Error;

    /// Every index once, the results in index order whichever thread finished first; a
    /// panicking call fails the whole, and none or one call runs on the caller's thread.
    #[test]
    fn side_by_side_calls_each_index_once_and_keeps_their_order() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls: Vec<AtomicUsize> = (0..37).map(|_| AtomicUsize::new(0)).collect();
        let got = side_by_side(37, |i| {
            calls[i].fetch_add(1, Ordering::Relaxed);
            // Later indices finish sooner, so the threads' own order is not the answer's.
            std::thread::sleep(std::time::Duration::from_micros(((37 - i) * 50) as u64));
            i * i + 1
        })
        .unwrap();
        assert_eq!(got, (0..37).map(|i| i * i + 1).collect::<Vec<_>>());
        assert!(calls.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        assert_eq!(side_by_side(0, |i| i).unwrap(), Vec::<usize>::new());
        let here = std::thread::current().id();
        assert_eq!(side_by_side(1, |_| std::thread::current().id()).unwrap(), vec![here]);
        let r = side_by_side(9, |i| {
            if i == 4 {
                panic!("index 4 fails");
            }
            i
        });
        assert!(matches!(r, Err(Error::Gpu(ref m)) if m.contains("panicked")), "{r:?}");
    }

    /// Every piece once, with its index and its own elements (the last shorter); a
    /// panicking piece fails the whole.
    #[test]
    fn pieces_side_by_side_visit_each_piece_once_with_its_index() {
        let mut v = vec![0usize; 1003];
        pieces_side_by_side(&mut v, 100, |i, p| {
            assert!(p.len() == 100 || (i == 10 && p.len() == 3), "piece {i} of {}", p.len());
            for (j, x) in p.iter_mut().enumerate() {
                *x += i * 100 + j + 1;
            }
        })
        .unwrap();
        assert_eq!(v, (1..=1003).collect::<Vec<_>>());
        let mut one = vec![7u8; 5];
        pieces_side_by_side(&mut one, 100, |i, p| p.fill(i as u8)).unwrap();
        assert_eq!(one, vec![0u8; 5]);
        pieces_side_by_side(&mut Vec::<u8>::new(), 4, |_, _| panic!("no piece in an empty slice")).unwrap();
        let r = pieces_side_by_side(&mut vec![0u8; 64], 8, |i, _| assert!(i != 5, "piece 5 fails"));
        assert!(matches!(r, Err(Error::Gpu(ref m)) if m.contains("panicked")), "{r:?}");
    }

    #[test]
    fn workers_follow_the_cores_within_bounds() {
        assert_eq!(workers(None), 1);
        assert_eq!(workers(Some(0)), 1);
        assert_eq!(workers(Some(2)), 2);
        assert_eq!(workers(Some(128)), 16);
    }
}
