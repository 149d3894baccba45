//! The engine's storage traits over the index's buffers: the one search,
//! insert and repair routine of the engine runs on PostgreSQL pages through
//! this, under buffer locks and GenericXLog.
//!
//! Lock order: a graph page may be held exclusively while vector pages are
//! read (insert re-prunes a list under its lock); a vector page lock is never
//! held while another lock is taken, so no cycle can form. The meta page is
//! taken first when taken at all.

use gpu_graph_engine::store::{GraphMut, GraphView, Visit};
use gpu_graph_engine::NO_NODE;
use pgrx::pg_sys;

use super::buffer::{init_page, page_contents, Locked, Xlog};
use super::layout::{Layout, FLAG_DELETED, FLAG_FREE, VECTOR_HEADER};
use super::meta::{Meta, FREE_CAP};

/// A heap TID packed in the engine's u64 payload: block << 16 | offset.
pub fn tid_to_payload(tid: &pg_sys::ItemPointerData) -> u64 {
    let block = ((tid.ip_blkid.bi_hi as u64) << 16) | tid.ip_blkid.bi_lo as u64;
    (block << 16) | tid.ip_posid as u64
}

pub fn payload_to_tid(p: u64) -> pg_sys::ItemPointerData {
    let block = (p >> 16) as u32;
    pg_sys::ItemPointerData {
        ip_blkid: pg_sys::BlockIdData { bi_hi: (block >> 16) as u16, bi_lo: block as u16 },
        ip_posid: p as u16,
    }
}

/// Header of a vector tuple: the TID as three u16 words, then the flags.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct VectorHeader {
    pub tid: [u16; 3],
    pub flags: u16,
}

impl VectorHeader {
    pub fn new(payload: u64, flags: u16) -> VectorHeader {
        let t = payload_to_tid(payload);
        VectorHeader { tid: [t.ip_blkid.bi_hi, t.ip_blkid.bi_lo, t.ip_posid], flags }
    }
    pub fn payload(&self) -> u64 {
        let block = ((self.tid[0] as u64) << 16) | self.tid[1] as u64;
        (block << 16) | self.tid[2] as u64
    }
}

/// Writes one vector tuple at `p`.
///
/// # Safety
/// `p` must point at `VECTOR_HEADER + 4 * v.len()` writable bytes, 4-aligned.
pub unsafe fn write_vector_tuple(p: *mut u8, payload: u64, flags: u16, v: &[f32]) {
    std::ptr::write(p as *mut VectorHeader, VectorHeader::new(payload, flags));
    std::ptr::copy_nonoverlapping(v.as_ptr(), p.add(VECTOR_HEADER) as *mut f32, v.len());
}

/// Writes a neighbour list (padded with NO_NODE) at `p`.
///
/// # Safety
/// `p` must point at `4 * degree` writable bytes, 4-aligned.
pub unsafe fn write_list(p: *mut u8, list: &[u32], degree: usize) {
    let out = std::slice::from_raw_parts_mut(p as *mut u32, degree);
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = list.get(i).copied().unwrap_or(NO_NODE);
    }
}

/// Formats the pages of a new chunk: an empty graph page, then vector pages
/// whose every slot is free.
///
/// # Safety
/// `pages` must be `layout.pages_per_chunk` BLCKSZ page images.
pub unsafe fn format_chunk_page(page: pg_sys::Page, index_in_chunk: usize, layout: &Layout) {
    init_page(page);
    let c = page_contents(page);
    if index_in_chunk == 0 {
        write_list(c, &[], layout.degree * layout.per_chunk);
    } else {
        for slot in 0..layout.per_vector_page {
            let p = c.add(slot * layout.vector_size());
            std::ptr::write(p as *mut VectorHeader, VectorHeader::new(0, FLAG_FREE));
        }
    }
}

pub struct PageStore {
    pub rel: pg_sys::Relation,
    pub layout: Layout,
}

impl PageStore {
    pub fn new(rel: pg_sys::Relation, meta: &Meta) -> PageStore {
        PageStore { rel, layout: meta.layout() }
    }

    /// Sets flags on a node's vector tuple, WAL-logged; returns the old flags.
    fn set_flags(&self, node: u32, f: impl FnOnce(u16) -> u16) -> u16 {
        unsafe {
            let b = Locked::read(self.rel, self.layout.vector_block(node), true);
            let mut x = Xlog::start(self.rel);
            let page = x.register(&b, false);
            let h = page_contents(page).add(self.layout.vector_offset(node)) as *mut VectorHeader;
            let old = (*h).flags;
            (*h).flags = f(old);
            x.finish();
            old
        }
    }

    /// Appends a new chunk's pages; the caller holds the meta page exclusively,
    /// which serialises allocation.
    unsafe fn extend_chunk(&self, first_node: u32) {
        pg_sys::LockRelationForExtension(self.rel, pg_sys::ExclusiveLock as i32);
        let expected = self.layout.graph_block(first_node);
        for i in 0..self.layout.pages_per_chunk {
            let buf = pg_sys::ReadBufferExtended(
                self.rel,
                pg_sys::ForkNumber::MAIN_FORKNUM,
                pg_sys::InvalidBlockNumber, // P_NEW
                pg_sys::ReadBufferMode::RBM_NORMAL,
                std::ptr::null_mut(),
            );
            pg_sys::LockBuffer(buf, pg_sys::BUFFER_LOCK_EXCLUSIVE as i32);
            let b = Locked { buf };
            let got = pg_sys::BufferGetBlockNumber(buf);
            if got != expected + i as u32 {
                pgrx::error!(
                    "gpu_graph: index has unexpected block {got} (expected {}); REINDEX it",
                    expected + i as u32
                );
            }
            let mut x = Xlog::start(self.rel);
            let page = x.register(&b, true);
            format_chunk_page(page, i, &self.layout);
            x.finish();
        }
        pg_sys::UnlockRelationForExtension(self.rel, pg_sys::ExclusiveLock as i32);
    }
}

impl GraphView for PageStore {
    fn stored_dim(&self) -> usize {
        self.layout.stored_dim
    }
    fn degree(&self) -> usize {
        self.layout.degree
    }
    fn node_count(&self) -> u32 {
        unsafe { Meta::read(self.rel).node_count }
    }
    fn entry(&self) -> Option<u32> {
        unsafe { Meta::read(self.rel).entry() }
    }
    fn visit<F: FnOnce(&[f32]) -> f32>(&self, node: u32, dist: F) -> Option<Visit> {
        unsafe {
            let b = Locked::read(self.rel, self.layout.vector_block(node), false);
            let p = b.contents().add(self.layout.vector_offset(node));
            let h = std::ptr::read(p as *const VectorHeader);
            if h.flags & FLAG_FREE != 0 {
                return None;
            }
            let v = std::slice::from_raw_parts(p.add(VECTOR_HEADER) as *const f32, self.layout.stored_dim);
            Some(Visit { dist: dist(v), payload: h.payload(), deleted: h.flags & FLAG_DELETED != 0 })
        }
    }
    fn neighbors(&self, node: u32, out: &mut Vec<u32>) {
        out.clear();
        unsafe {
            let b = Locked::read(self.rel, self.layout.graph_block(node), false);
            let p = b.contents().add(self.layout.graph_offset(node)) as *const u32;
            for i in 0..self.layout.degree {
                let n = *p.add(i);
                if n == NO_NODE {
                    break;
                }
                out.push(n);
            }
        }
    }
}

impl GraphMut for PageStore {
    fn allocate(&self, stored: &[f32], payload: u64) -> u32 {
        assert_eq!(stored.len(), self.layout.stored_dim);
        let node = unsafe {
            let meta_buf = Locked::read(self.rel, 0, true);
            let mut m = std::ptr::read_unaligned(meta_buf.contents() as *const Meta);
            let node = if m.free_count > 0 {
                m.free_count -= 1;
                m.free[m.free_count as usize]
            } else {
                let n = m.node_count;
                if n as usize % self.layout.per_chunk == 0 {
                    self.extend_chunk(n);
                }
                m.node_count += 1;
                n
            };
            m.generation += 1;
            let mut x = Xlog::start(self.rel);
            let page = x.register(&meta_buf, false);
            std::ptr::write_unaligned(page_contents(page) as *mut Meta, m);
            x.finish();
            node
        };
        unsafe {
            let b = Locked::read(self.rel, self.layout.vector_block(node), true);
            let mut x = Xlog::start(self.rel);
            let page = x.register(&b, false);
            write_vector_tuple(page_contents(page).add(self.layout.vector_offset(node)), payload, 0, stored);
            x.finish();
        }
        node
    }

    fn update_neighbors(&self, node: u32, f: &mut dyn FnMut(&mut Vec<u32>) -> bool) {
        unsafe {
            let b = Locked::read(self.rel, self.layout.graph_block(node), true);
            let off = self.layout.graph_offset(node);
            let p = b.contents().add(off) as *const u32;
            let mut list: Vec<u32> = (0..self.layout.degree).map(|i| *p.add(i)).take_while(|&n| n != NO_NODE).collect();
            if !f(&mut list) {
                return;
            }
            list.truncate(self.layout.degree);
            let mut x = Xlog::start(self.rel);
            let page = x.register(&b, false);
            write_list(page_contents(page).add(off), &list, self.layout.degree);
            x.finish();
        }
    }

    fn set_entry(&self, node: Option<u32>) {
        unsafe { Meta::update(self.rel, |m| m.entry = node.unwrap_or(NO_NODE)) }
    }

    fn mark_deleted(&self, node: u32) {
        self.set_flags(node, |f| f | FLAG_DELETED);
    }

    fn free(&self, node: u32) {
        self.update_neighbors(node, &mut |l| {
            l.clear();
            true
        });
        self.set_flags(node, |_| FLAG_FREE);
        unsafe {
            Meta::update(self.rel, |m| {
                // ids beyond the free list's capacity stay free slots until a
                // later VACUUM finds room for them (see vacuum.rs)
                if (m.free_count as usize) < FREE_CAP {
                    m.free[m.free_count as usize] = node;
                    m.free_count += 1;
                }
            })
        }
    }
}
