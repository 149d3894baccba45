//! What a paged build (CREATE INDEX whose vectors exceed
//! maintenance_work_mem) reads and spills through PostgreSQL: the stored
//! vectors read back from the index's own vector pages, already written
//! by the heap scan ([`PageRows`]), and each shard's lists kept in
//! temporary files until the merge ([`TempLists`]). The sharded build
//! itself is the engine's (`engine::sharded`), the same loop as an
//! in-memory one.

use gpu_graph_engine::cfs::Algorithm;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::sharded::{Lists, Plan, Rows, SAMPLE};
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::storage::codec::PageRef;
use crate::storage::layout::{Layout, BLCKSZ};

/// The stored vectors of nodes `0..n`, read from the vector pages of an
/// index being built (written through its bulk writer, which has written
/// out every page queued): straight from the file, as nothing else sees
/// the relation yet and shared buffers hold none of its pages.
pub struct PageRows {
    rel: pg_sys::Relation,
    layout: Layout,
    n: usize,
    page: Box<Page>,
}

#[repr(C, align(8))]
struct Page([u8; BLCKSZ]);

impl PageRows {
    /// # Safety
    /// `rel` is the index being built, open, its vector pages of nodes
    /// `0..n` in `layout` written to its file.
    pub unsafe fn new(rel: pg_sys::Relation, layout: Layout, n: usize) -> PageRows {
        PageRows { rel, layout, n, page: Box::new(Page([0; BLCKSZ])) }
    }
}

impl Rows for PageRows {
    fn len(&self) -> usize {
        self.n
    }
    fn dim(&self) -> usize {
        self.layout.stored_dim
    }
    fn read(&mut self, ids: &[u32], out: &mut Vec<f32>) {
        let sd = self.layout.stored_dim;
        let at = out.len();
        out.resize(at + ids.len() * sd, 0.0);
        let mut loaded = None;
        for (i, &id) in ids.iter().enumerate() {
            let block = self.layout.vector_block(id);
            if loaded != Some(block) {
                // SAFETY: the relation is open and its block written (new's
                // contract); the page buffer is BLCKSZ bytes.
                unsafe {
                    let smgr = pg_sys::RelationGetSmgr(self.rel);
                    pg_sys::smgrread(smgr, pg_sys::ForkNumber::MAIN_FORKNUM, block, self.page.0.as_mut_ptr().cast());
                }
                loaded = Some(block);
            }
            // SAFETY: a MAXALIGNed BLCKSZ image in our own memory, which
            // nothing writes while it is read here.
            let page = unsafe { PageRef::new(self.page.0.as_mut_ptr() as pg_sys::Page) };
            page.tuple(&self.layout, id).vector.copy_to(&mut out[at + i * sd..at + (i + 1) * sd]);
        }
    }
}

/// Each shard's lists in a temporary file of its own (PostgreSQL's
/// BufFile: under temp_tablespaces, counted by temp_file_limit, deleted at
/// the end of the transaction whichever way it ends).
pub struct TempLists {
    files: Vec<*mut pg_sys::BufFile>,
    degree: usize,
}

/// A BufFile's segments: the offsets it seeks to are within one.
const SEGMENT: u64 = 1 << 30;
const ENTRY: usize = std::mem::size_of::<(u32, f32)>();

impl TempLists {
    pub fn new(degree: usize) -> TempLists {
        TempLists { files: Vec::new(), degree }
    }
}

impl Drop for TempLists {
    fn drop(&mut self) {
        for &f in &self.files {
            // SAFETY: a file this spill created and has not closed. An
            // ERROR unwinds the Rust frames (pgrx) before the transaction
            // aborts, so this runs then too, ahead of the resource owner.
            unsafe { pg_sys::BufFileClose(f) };
        }
    }
}

impl Lists for TempLists {
    fn write(&mut self, shard: usize, lists: &[(u32, f32)]) {
        while self.files.len() <= shard {
            // SAFETY: a temporary file of this transaction.
            self.files.push(unsafe { pg_sys::BufFileCreateTemp(false) });
        }
        // SAFETY: an open BufFile; the bytes are the entries' (plain u32 and
        // f32, no padding).
        unsafe {
            pg_sys::BufFileWrite(self.files[shard], lists.as_ptr() as *mut std::ffi::c_void, lists.len() * ENTRY)
        };
    }
    fn read(&mut self, shard: usize, first: usize, count: usize, out: &mut Vec<(u32, f32)>) {
        let len = count * self.degree;
        let offset = (first * self.degree * ENTRY) as u64;
        let at = out.len();
        out.resize(at + len, (0, 0.0));
        // SAFETY: an open BufFile written by `write`; `out` has room for the
        // bytes read, and every bit pattern is an entry.
        let got = unsafe {
            let f = self.files[shard];
            if pg_sys::BufFileSeek(f, (offset / SEGMENT) as i32, (offset % SEGMENT) as pg_sys::off_t, libc::SEEK_SET)
                != 0
            {
                error!("gpu_graph: could not seek in a temporary file of the build");
            }
            pg_sys::BufFileRead(f, out[at..].as_mut_ptr() as *mut std::ffi::c_void, len * ENTRY)
        };
        if got != len * ENTRY {
            error!("gpu_graph: read {got} of {} bytes from a temporary file of the build", len * ENTRY);
        }
    }
}

/// The fewest rows a shard of a build of `n` rows may hold.
pub fn min_shard_rows(n: usize) -> usize {
    MIN_SHARD_ROWS.min(n)
}

/// Bytes a row costs a shard's build besides its stored vector: the
/// builder's candidate pools and the final lists (and the row's payload,
/// while the whole build holds every row).
pub fn builder_bytes_per_row(params: &BuildParams) -> usize {
    8 + params.r * 16 + params.degree * 4
}

/// What a CFS refinement (gpu_graph_engine::cfs::refine) of a shard holds
/// a row besides its rows and start graph: the collected lists and their
/// reverse edges with distances, the stored lists and the new graph.
pub fn refine_bytes_per_row(degree: usize) -> usize {
    degree * (8 + 8 + 8 + 4) + 16
}

/// The fewest rows a shard may hold: a budget that fits fewer cannot build.
pub const MIN_SHARD_ROWS: usize = 1000;

/// The plan of a paged build of `n` rows within `budget` bytes of host
/// memory: the partition's ids (two u32 a row) first; then a sample of at
/// most an eighth of the budget; a shard's rows cost their vectors (times
/// the shards held at once: one for each GPU building and the next one
/// read), the builder's pools
/// (`per_row`; for a CFS graph (`cfs`), what a shard's CFS refinement
/// holds besides) and their lists with distances; the merge takes a quarter
/// of the budget, in whole chunks, and a CFS graph's merge by its filter
/// (and order) the rows it reads back another quarter: the shards' rows are gone by then. None
/// when a shard of MIN_SHARD_ROWS does not fit (or the whole build, when
/// smaller): the least budget, in bytes.
pub fn plan(
    n: usize,
    budget: usize,
    layout: &Layout,
    params: &BuildParams,
    shards_held: usize,
    cfs: Option<Algorithm>,
) -> Result<Plan, usize> {
    let refine = cfs.is_some();
    let ahead = shards_held > 1;
    // each GPU's builder holds its shard's download of lists on the host,
    // and one more is held while a shard's lists are given distances (measured: 20M
    // x 96 at 2 GB peaked at 2.8 GB private before this was charged, the
    // CUDA context's ~0.4 GB included); the CPU's its candidate pools
    let mut per_row = if ahead { params.degree * 4 * shards_held } else { builder_bytes_per_row(params) };
    if refine {
        per_row += refine_bytes_per_row(params.degree);
    }
    let row = layout.stored_dim * 4;
    let sample = (budget / 8 / row).min(SAMPLE);
    let fixed = 8 * n + sample * row;
    let per_shard_row = row * shards_held.max(1) + per_row + layout.degree * 8;
    let max_rows = budget.saturating_sub(fixed) / per_shard_row;
    let least = min_shard_rows(n);
    if max_rows < least || sample < least.min(100) {
        return Err(fixed + (least * per_shard_row).max(least.min(100) * row * 8));
    }
    let chunk = layout.per_chunk.max(1);
    let merge_rows = (budget / 4 / (layout.degree * (2 * 8 + 4))).max(chunk) / chunk * chunk;
    let assign_batch = (budget / 4 / row).max(1);
    let (degree, seed) = (params.degree, params.seed);
    // a node's candidates: both its lists, each a row read back
    let filter_batch = (budget / 4 / (2 * layout.degree * row).max(1)).max(1);
    Ok(Plan {
        degree,
        seed,
        max_rows,
        sample,
        assign_batch,
        merge_batch: merge_rows,
        merge_filter: cfs.map(Algorithm::filter),
        merge_order: cfs.and_then(Algorithm::order),
        filter_batch,
    })
}
