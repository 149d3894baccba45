//! Which index copies the worker holds: made on first use, keyed by
//! RelFileNode and the meta page's generation, refreshed when a request
//! names a newer generation, and evicted least recently used first to stay
//! under gpu_graph.gpu_memory_limit. One copy is made at a time.

use gpu_graph_gpu::search::Patch;
use pgrx::pg_sys;

use super::changes::{Change, CAPACITY};
use super::device::{Device, Handle};
use super::image::{self, patch, Begin, Changed, File, GpuPatch, Key, Loader};
use super::outcome::Outcome;
use super::ring::Request;
use super::rows::Rows;
use super::shmem::Shared;
use super::stats::{add, ResidentEntry};
use crate::storage::layout::Element;
use crate::storage::meta::Meta;

/// Pages read per step of a load (about 2 MB, well under a millisecond):
/// requests wait at most that long behind a load.
const PAGES_PER_STEP: u32 = 256;

pub struct Resident {
    key: Key,
    file: File,
    generation: u64,
    pub handle: Handle,
    nodes: u32,
    bytes: usize,
    loaded_at: i64,
    used: u64,
    /// each block's LSN as the copy last read it whole (image::resync)
    lsns: Vec<u64>,
    /// the meta page as the copy last applied it (image::patch)
    meta: Option<Meta>,
    /// a change did not make it into the copy (a failed patch, or the log
    /// lost changes that could not be read again): it answers no request
    /// and follows the log no more until a new copy replaces it
    lost: bool,
    /// each node's row, followed with the copy (worker::rows)
    rows: Rows,
    /// whether the copy's search distances are those of the pages' own
    /// vectors (not fp16 roundings of a storage = 'f32' index's): its
    /// answers then carry rows and distances
    exact: bool,
    /// which copy of the index this is (a new copy's nodes may be other rows)
    serial: u64,
}

impl Resident {
    /// A change did not make it into the copy: see `lost` (its generation
    /// 0 only for gpu_graph_info, which shows the copy out of date).
    fn lose(&mut self) {
        self.lost = true;
        self.generation = 0;
        self.meta = None;
    }
}

/// The copy an answer came from: its rows are given with the answer only
/// if the same copy is still there, following the log, at answer time.
#[derive(Clone, Copy)]
pub struct CopyId {
    key: Key,
    serial: u64,
}

impl Resident {
    pub fn id(&self) -> CopyId {
        CopyId { key: self.key, serial: self.serial }
    }
}

pub enum Lookup<'a> {
    Ready(&'a Resident),
    /// no copy at (or after) the asked generation
    Stale,
    /// this generation of the index does not fit
    Unfit,
}

#[derive(Default)]
pub struct Residency {
    residents: Vec<Resident>,
    loading: Option<Box<Loader>>,
    /// generations that did not fit: not tried again until the index changes
    unfit: Vec<(Key, u64)>,
    clock: u64,
    /// the change log read up to here (None: not yet started)
    applied: Option<u64>,
    changes: Vec<Change>,
}

impl Residency {
    /// The copy of `key` for a request that read the meta page's
    /// `generation` and needs the change log read up to `need`.
    pub fn lookup(&mut self, key: Key, generation: u64, need: u64) -> Lookup<'_> {
        self.clock += 1;
        if self.unfit.iter().any(|&(k, g)| k == key && g >= generation) {
            return Lookup::Unfit;
        }
        let followed = self.applied.is_some_and(|a| a >= need);
        match self.residents.iter_mut().find(|r| r.key == key) {
            // a copy newer than the backend's view is as good: rows the
            // backend cannot see are filtered by the executor's visibility
            // check (worker::rows). So is one that follows the log and has
            // every change committed before the request: an insert in
            // progress may have moved the generation on already. A lost
            // copy does neither.
            Some(r) if !r.lost && (r.generation >= generation || followed) => {
                r.used = self.clock;
                Lookup::Ready(r)
            }
            _ => Lookup::Stale,
        }
    }

    /// The rows of copy `id` for an answer from it: None when the copy is
    /// gone or replaced, lost, or its distances are not the pages' (the
    /// backend then reads the answer's nodes from the pages).
    pub fn rows(&self, id: CopyId) -> Option<&Rows> {
        self.residents.iter().find(|r| r.key == id.key && r.serial == id.serial && !r.lost && r.exact).map(|r| &r.rows)
    }

    /// Starts copying the index `req` names, unless a copy is under way.
    ///
    /// # Safety
    /// The worker's main thread.
    pub unsafe fn want(&mut self, req: &Request, device: &Device, limit: usize, shared: &Shared) {
        if self.loading.is_some() {
            return;
        }
        let key = Key::of(req);
        // SAFETY: the worker's main thread, with its resource owner (the
        // caller's contract).
        let l = match unsafe { Loader::begin(req, limit) } {
            Begin::Started(l) => l,
            Begin::NotNow => return,
            Begin::TooLarge { generation, bytes } => {
                self.mark_unfit(
                    key,
                    generation,
                    &format!("it needs {} MB, more than gpu_graph.gpu_memory_limit or memory allow", bytes >> 20),
                );
                return;
            }
        };
        let bytes = l.bytes();
        // the old copy of this index goes now: it cannot answer the newer
        // requests, and its memory is wanted for the new one
        if let Some(i) = self.residents.iter().position(|r| r.key == l.key) {
            device.remove(self.residents.swap_remove(i).handle);
        }
        self.make_room(bytes, limit, device, shared);
        self.publish(shared);
        self.loading = Some(l);
    }

    /// Whether requests that need the log read up to `need` must wait for a
    /// [`Residency::sync`]: the log holds published changes not read yet,
    /// or a quarter of its room unread (a long transaction's writes, which
    /// no request needs yet, must not overflow it).
    pub fn behind(&self, need: u64, shared: &Shared) -> bool {
        match self.applied {
            None => true,
            Some(a) => need > a || shared.changes.head().saturating_sub(a) > CAPACITY as u64 / 4,
        }
    }

    /// Brings the copies up to date with the change log: called after a
    /// batch of requests is taken and before any is answered, so each
    /// answer holds every change committed before its request (and when
    /// the worker is idle, so that writes alone do not overflow the log).
    /// Each copy is patched in place (`follow`); one that cannot be, and
    /// every copy after an overflow, is marked out of date and refreshed
    /// whole when a request asks for a newer generation.
    ///
    /// # Safety
    /// The worker's main thread, with a resource owner.
    pub unsafe fn sync(&mut self, device: &Device, shared: &Shared) -> Result<(), String> {
        let t = std::time::Instant::now();
        // SAFETY: the caller's contract.
        let r = unsafe { self.follow_log(device, shared) };
        if t.elapsed() > std::time::Duration::from_millis(10) {
            add(&shared.counters.slow_syncs, 1);
        }
        r
    }

    /// [`Residency::sync`] itself.
    ///
    /// # Safety
    /// As for [`Residency::sync`].
    unsafe fn follow_log(&mut self, device: &Device, shared: &Shared) -> Result<(), String> {
        let log = &shared.changes;
        let Some(from) = self.applied else {
            // the worker's first look: its copies are all made from now on
            self.applied = Some(log.head());
            return Ok(());
        };
        self.changes.clear();
        match log.read(from, &mut self.changes) {
            Ok(next) => self.applied = Some(next),
            Err(_) => {
                self.applied = Some(log.head());
                add(&shared.counters.log_overflows, 1);
                // the lost changes moved their pages' LSNs: each copy reads
                // those pages again in place and keeps answering (else it
                // is refreshed whole when a request asks for a newer one)
                for r in self.residents.iter_mut().filter(|r| !r.lost) {
                    // SAFETY: the worker's main thread (the caller's contract).
                    // (lost: refreshed whole when a request needs it)
                    match unsafe { resync(r, device, shared) }? {
                        Some(g) => r.generation = g,
                        None => r.lose(),
                    }
                }
                if let Some(l) = self.loading.as_mut() {
                    l.lost = true;
                }
                self.publish(shared);
                return Ok(());
            }
        }
        if self.changes.is_empty() {
            return Ok(());
        }
        let mut touched = false;
        let mut blocks = Changed::default();
        for r in self.residents.iter_mut().filter(|r| !r.lost) {
            blocks.clear();
            self.changes.iter().filter(|c| c.key == r.key).for_each(|c| blocks.add(c));
            if blocks.is_empty() {
                continue;
            }
            // (the patch drops lists and rows that later changes supersede)
            let noted = blocks.len();
            let t = std::time::Instant::now();
            // SAFETY: the worker's main thread (the caller's contract).
            let patched = unsafe { follow(r, device, &mut blocks, shared) }?;
            add(&shared.counters.patch_us, t.elapsed().as_micros() as u64);
            match patched {
                Some(g) => {
                    r.generation = g;
                    add(&shared.counters.patches, 1);
                    add(&shared.counters.patched_pages, noted as u64);
                    touched = true;
                }
                // refreshed whole when a request asks for a newer one
                None => r.lose(),
            }
        }
        if let Some(l) = self.loading.as_mut() {
            self.changes.iter().filter(|c| c.key == l.key).for_each(|c| l.changed.add(c));
        }
        if touched {
            self.publish(shared);
        }
        Ok(())
    }

    /// Evicts least recently used copies until `bytes` more fit.
    fn make_room(&mut self, bytes: usize, limit: usize, device: &Device, shared: &Shared) {
        if limit == 0 {
            return;
        }
        while self.residents.iter().map(|r| r.bytes).sum::<usize>() + bytes > limit {
            let Some(i) = self.residents.iter().enumerate().min_by_key(|(_, r)| r.used).map(|(i, _)| i) else { break };
            device.remove(self.residents.swap_remove(i).handle);
            add(&shared.counters.evictions, 1);
        }
    }

    /// One step of the load under way; true while one is.
    ///
    /// # Safety
    /// The worker's main thread.
    pub unsafe fn step(&mut self, device: &Device, limit: usize, shared: &Shared) -> Result<bool, String> {
        let Some(l) = self.loading.as_mut() else { return Ok(false) };
        // SAFETY: the worker's main thread (the caller's contract), where
        // the load began.
        if !unsafe { l.step(PAGES_PER_STEP) } {
            return Ok(true);
        }
        let mut l = self.loading.take().unwrap();
        let (key, file, started, mut changed) = (l.key, l.file, l.started, std::mem::take(&mut l.changed));
        let mut lsns = std::mem::take(&mut l.lsns);
        let (mut generation, mut lost, element) = (l.generation, l.lost, l.element());
        let (mut image, mut rows) = l.take();
        let mut meta = None;
        if lost {
            // the log lost changes made while it was read: the pages whose
            // LSN moved since, read again in place (as for a copy's overflow)
            // SAFETY: the worker's main thread (the caller's contract).
            if let Some((g, _)) = unsafe { image::resync(key, file, &mut image, &mut rows, &mut lsns, &mut meta) } {
                (generation, lost) = (g, false);
            }
        } else if !changed.is_empty() {
            // pages written while it was read: read again, the generation
            // then the meta page's now
            // SAFETY: the worker's main thread (the caller's contract).
            match unsafe { patch(key, file, &mut image, &mut rows, &mut changed, &mut lsns, &mut meta) } {
                Some(g) => generation = g,
                None => lost = true,
            }
        }
        let nodes = image.len() as u32;
        match device.install(image, &rows) {
            Ok((handle, bytes)) => {
                // the device may hold it smaller (fp16) or larger than planned
                self.make_room(bytes, limit, device, shared);
                self.clock += 1;
                let exact = element == Element::F16 || !device.rounds(&handle);
                // SAFETY: reads the clock; any process may.
                let loaded_at = unsafe { pg_sys::GetCurrentTimestamp() };
                self.residents.push(Resident {
                    key,
                    file,
                    generation,
                    handle,
                    nodes,
                    bytes,
                    loaded_at,
                    used: self.clock,
                    lsns,
                    meta,
                    lost,
                    rows,
                    exact,
                    serial: self.clock,
                });
                self.unfit.retain(|&(k, _)| k != key);
                add(&shared.counters.loads, 1);
                add(&shared.counters.load_us, started.elapsed().as_micros() as u64);
                self.publish(shared);
            }
            Err((_, why)) => {
                // a device that failed for good ends the worker; otherwise
                // this generation of the index stays on the CPU
                device.check()?;
                self.mark_unfit(key, generation, &why)
            }
        }
        Ok(false)
    }

    /// Remembers that this generation of the index is not to be copied; says
    /// so in the log the first time.
    fn mark_unfit(&mut self, key: Key, generation: u64, why: &str) {
        if !self.unfit.iter().any(|&(k, _)| k == key) {
            pgrx::log!(
                "gpu_graph search worker: scans of the index with relfilenode {} stay on the CPU: {why}",
                key.rel
            );
        }
        self.unfit.retain(|&(k, _)| k != key);
        self.unfit.push((key, generation));
    }

    fn publish(&self, shared: &Shared) {
        let list: Vec<ResidentEntry> = self
            .residents
            .iter()
            .map(|r| ResidentEntry {
                spc_node: r.key.spc,
                db_node: r.key.db,
                rel_node: r.key.rel,
                nodes: r.nodes,
                generation: r.generation,
                bytes: r.bytes as u64,
                loaded_at: r.loaded_at,
            })
            .collect();
        shared.residents.publish(&list);
    }

    /// Drops the copies of indexes that are gone (LRU eviction would take
    /// them only under memory pressure).
    ///
    /// # Safety
    /// The worker's main thread.
    pub unsafe fn forget_dropped(&mut self, device: &Device, shared: &Shared) {
        // SAFETY: the worker's main thread (the caller's contract).
        let exists = |k: &Key| unsafe { k.exists() };
        let before = self.residents.len();
        let mut i = 0;
        while i < self.residents.len() {
            if exists(&self.residents[i].key) {
                i += 1;
            } else {
                device.remove(self.residents.swap_remove(i).handle);
            }
        }
        self.unfit.retain(|(k, _)| exists(k));
        if self.residents.len() != before {
            self.publish(shared);
        }
    }

    /// Drops every copy (the worker is stopping).
    pub fn clear(&mut self, device: &Device, shared: &Shared) {
        self.loading = None;
        for r in self.residents.drain(..) {
            device.remove(r.handle);
        }
        self.publish(shared);
    }
}

/// [`image::resync`] of `r`'s copy, in memory or on the GPU: the index's
/// generation now, or None when the copy cannot be brought up to date in
/// place. Err when the device failed for good.
///
/// # Safety
/// The worker's main thread, with a resource owner.
unsafe fn resync(r: &mut Resident, device: &Device, shared: &Shared) -> Result<Option<u64>, String> {
    let t = std::time::Instant::now();
    let out = match (&mut r.handle, device) {
        (Handle::Cpu(image), _) => {
            // SAFETY: the caller's contract.
            let g = unsafe { image::resync(r.key, r.file, image, &mut r.rows, &mut r.lsns, &mut r.meta) };
            r.nodes = image.len() as u32;
            r.bytes = image.bytes();
            g
        }
        (Handle::Gpu(g), Device::Gpu(gpu)) => {
            let Some((stored_dim, degree, n)) = gpu.dims(g) else { return Ok(None) };
            let mut t = GpuPatch { stored_dim, degree, patch: Patch { n, ..Patch::default() } };
            // SAFETY: the caller's contract.
            match unsafe { image::resync(r.key, r.file, &mut t, &mut r.rows, &mut r.lsns, &mut r.meta) } {
                None => None,
                Some(read) => match gpu.patch(g, &mut t.patch, &r.rows) {
                    Ok(true) => {
                        r.nodes = t.patch.n as u32;
                        r.bytes = gpu.bytes(g).unwrap_or(r.bytes);
                        Some(read)
                    }
                    Ok(false) => None,
                    Err(o) => {
                        if o == Outcome::Error {
                            device.check()?;
                        }
                        None
                    }
                },
            }
        }
        _ => None,
    };
    if let Some((_, pages)) = out {
        add(&shared.counters.resyncs, 1);
        add(&shared.counters.resynced_pages, pages as u64);
        add(&shared.counters.patch_us, t.elapsed().as_micros() as u64);
    }
    Ok(out.map(|(g, _)| g))
}

/// Re-reads the changed `blocks` of `r`'s index into its copy: in place in
/// memory, or as a patch of the GPU's copy. The index's generation now, or
/// None when the copy cannot follow (see `image::patch`; a GPU copy that
/// is full with no device memory to grow into, or no longer exact in
/// fp16): it is then refreshed whole when a request needs it. Err when the
/// device failed for good.
///
/// # Safety
/// The worker's main thread, with a resource owner.
unsafe fn follow(
    r: &mut Resident,
    device: &Device,
    blocks: &mut Changed,
    shared: &Shared,
) -> Result<Option<u64>, String> {
    match (&mut r.handle, device) {
        (Handle::Cpu(image), _) => {
            let read = std::time::Instant::now();
            // SAFETY: the caller's contract.
            let g = unsafe { patch(r.key, r.file, image, &mut r.rows, blocks, &mut r.lsns, &mut r.meta) };
            add(&shared.counters.patch_read_us, read.elapsed().as_micros() as u64);
            r.nodes = image.len() as u32;
            r.bytes = image.bytes();
            Ok(g)
        }
        (Handle::Gpu(g), Device::Gpu(gpu)) => {
            let Some((stored_dim, degree, n)) = gpu.dims(g) else { return Ok(None) };
            let mut t = GpuPatch { stored_dim, degree, patch: Patch { n, ..Patch::default() } };
            let read = std::time::Instant::now();
            // SAFETY: the caller's contract.
            let generation = unsafe { patch(r.key, r.file, &mut t, &mut r.rows, blocks, &mut r.lsns, &mut r.meta) };
            add(&shared.counters.patch_read_us, read.elapsed().as_micros() as u64);
            let Some(generation) = generation else { return Ok(None) };
            match gpu.patch(g, &mut t.patch, &r.rows) {
                Ok(true) => {
                    r.nodes = t.patch.n as u32;
                    r.bytes = gpu.bytes(g).unwrap_or(r.bytes);
                    Ok(Some(generation))
                }
                Ok(false) => Ok(None),
                Err(o) => {
                    if o == Outcome::Error {
                        device.check()?;
                    }
                    Ok(None)
                }
            }
        }
        // an empty index's first rows: copied whole
        _ => Ok(None),
    }
}
