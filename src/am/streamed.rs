//! A paged build that one GPU holds whole: the rows go from the index's
//! pages to the device a piece at a time and the lists come back the same
//! way, so the host holds a few pieces, never the vectors. The build is the
//! in-memory one's (no shards, no merge): maintenance_work_mem bounds the
//! pieces, gpu_graph.build_gpu_memory the build.

use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

use gpu_graph_engine::medoid::{NearestRow, RowSum};
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::sharded::Rows;
use gpu_graph_gpu::{Control, Gpu, GpuError, KnnInit, PhaseTimes};

/// What the GPU's thread sends back: a piece of lists (first node, ids),
/// then how the build ended.
pub enum Back {
    Lists(usize, Vec<u32>),
    Done(Result<PhaseTimes, GpuError>),
}

/// A streamed build handed to a GPU's thread.
pub struct Job {
    pub n: usize,
    pub pieces: Receiver<Vec<f32>>,
    pub back: SyncSender<Back>,
    pub piece_rows: usize,
}

/// Pieces in flight each way: the backend reads the next while the device
/// copies one in (or the writer writes one while the next comes down).
pub const QUEUED: usize = 2;

/// Rows a piece, `budget` the host's bytes: a sixteenth of it (with the
/// pieces queued each way, the padded copy and the entry point's pass,
/// about a third in all), 1024 to 65536 rows, in whole chunks of `chunk`
/// rows (the lists come back as they are written: a graph page's chunk at
/// a time).
pub fn piece_rows(budget: usize, stored_dim: usize, chunk: usize) -> usize {
    let rows = (budget / 16 / (stored_dim * 4).max(1)).clamp(1024, 1 << 16);
    let chunk = chunk.max(1);
    (rows / chunk).max(1) * chunk
}

/// Runs `job` on `gpu` (the GPU's thread).
pub fn build(gpu: &Gpu, job: Job, stored_dim: usize, params: &BuildParams, knn: KnnInit, control: &dyn Control) {
    let Job { n, pieces, back, piece_rows } = job;
    let r = gpu_graph_gpu::build_streamed(
        gpu,
        n,
        stored_dim,
        params,
        knn,
        &mut || pieces.recv().ok(),
        piece_rows,
        // a backend gone has set `control`'s stop: the rest is dropped
        &mut |first, lists| {
            let _ = back.send(Back::Lists(first, lists.to_vec()));
        },
        control,
    );
    let _ = back.send(Back::Done(r));
}

/// The backend's side: hands `rows` over in order, finds the entry point
/// (the row nearest the mean, as the in-memory build's) while the device
/// builds, and gives the lists to `merged` as they come. `wait` runs
/// whenever it waits (progress, interrupts).
pub fn feed(
    rows: &mut dyn Rows,
    pieces: SyncSender<Vec<f32>>,
    back: Receiver<Back>,
    piece_rows: usize,
    merged: &mut dyn FnMut(usize, &[u32]),
    wait: &mut dyn FnMut(),
) -> Result<(u32, PhaseTimes), GpuError> {
    let (n, sd) = (rows.len(), rows.dim());
    let mut sum = RowSum::new(sd);
    let mut ids = Vec::with_capacity(piece_rows);
    let mut sent = true;
    for first in (0..n).step_by(piece_rows) {
        ids.clear();
        ids.extend(first as u32..(first + piece_rows).min(n) as u32);
        let mut piece = Vec::with_capacity(ids.len() * sd);
        rows.read(&ids, &mut piece);
        sum.add(&piece);
        if !hand_over(&pieces, piece, wait) {
            // the GPU's thread ended: its Done says why
            sent = false;
            break;
        }
    }
    drop(pieces);
    let mut entry = NearestRow::new(sum.mean());
    let mut piece = Vec::with_capacity(piece_rows * sd);
    for first in (0..n).step_by(piece_rows).take_while(|_| sent) {
        ids.clear();
        ids.extend(first as u32..(first + piece_rows).min(n) as u32);
        piece.clear();
        rows.read(&ids, &mut piece);
        entry.add(first, &piece);
        wait();
    }
    loop {
        match back.recv_timeout(Duration::from_millis(10)) {
            Ok(Back::Lists(first, lists)) => merged(first, &lists),
            Ok(Back::Done(r)) => return r.map(|t| (entry.row().unwrap_or(0), t)),
            Err(RecvTimeoutError::Timeout) => wait(),
            Err(RecvTimeoutError::Disconnected) => return Err(GpuError::Cuda("the GPU build thread ended".into())),
        }
    }
}

/// Queues `piece`, waiting while the queue is full; false when the GPU's
/// thread no longer takes pieces.
fn hand_over(to: &SyncSender<Vec<f32>>, mut piece: Vec<f32>, wait: &mut dyn FnMut()) -> bool {
    loop {
        match to.try_send(piece) {
            Ok(()) => return true,
            Err(TrySendError::Full(p)) => {
                piece = p;
                wait();
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(TrySendError::Disconnected(_)) => return false,
        }
    }
}
