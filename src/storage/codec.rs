//! The page codec: what the bytes of the index's pages mean. The only code
//! that computes an offset into a page or reads page bytes as a value; the
//! page store (scans, inserts, VACUUM), the bulk writer (CREATE INDEX), the
//! meta page and the search worker's loader all go through it.
//!
//! A page is PostgreSQL's page header ([`PAGE_HEADER`] bytes) and then
//! contents used whole (pd_lower = pd_upper = BLCKSZ, see `buffer`):
//!
//! - the meta page: one [`Meta`], unaligned;
//! - a graph page: `per_chunk` neighbour lists of `degree` u32 slots each, a
//!   list's unused slots [`NO_NODE`];
//! - a vector page: `per_vector_page` vector tuples of
//!   [`Layout::vector_size`] bytes: the heap TID as three u16 words (block
//!   high, block low, offset), the flags (u16), then `stored_dim` f32, or
//!   IEEE half with `storage = 'f16'` (the layout's element).
//!
//! Values are in the machine's byte order, as in PostgreSQL's own pages.
//! Page images are MAXALIGNed (shared and local buffers, a WAL record's
//! copies), so the contents start 8-aligned and every list and vector, at a
//! multiple of 4 bytes, is read in place.

use std::ops::Range;

use gpu_graph_engine::store::Visit;
use gpu_graph_engine::NO_NODE;
use half::f16;
// SIMD conversions of whole vectors (F16C where the CPU has it)
use half::slice::HalfFloatSliceExt;
use pgrx::pg_sys;

use super::layout::{Element, Layout, BLCKSZ, FLAG_DELETED, FLAG_FREE, PAGE_HEADER, USABLE, VECTOR_HEADER};
use super::meta::Meta;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    fn decode(b: &[u8]) -> VectorHeader {
        let word = |i: usize| u16::from_ne_bytes([b[2 * i], b[2 * i + 1]]);
        VectorHeader { tid: [word(0), word(1), word(2)], flags: word(3) }
    }
    fn encode(&self, out: &mut [u8]) {
        for (i, w) in self.tid.iter().chain([&self.flags]).enumerate() {
            out[2 * i..2 * i + 2].copy_from_slice(&w.to_ne_bytes());
        }
    }
}

/// A stored vector, read in place.
#[derive(Clone, Copy)]
pub enum Stored<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl Stored<'_> {
    /// Calls `f` with the vector in f32: in place, or widened into `scratch`.
    pub fn with_f32<R>(&self, scratch: &mut Vec<f32>, f: impl FnOnce(&[f32]) -> R) -> R {
        match self {
            Stored::F32(v) => f(v),
            Stored::F16(v) => {
                scratch.resize(v.len(), 0.0);
                v.convert_to_f32_slice(scratch);
                f(scratch)
            }
        }
    }

    /// Writes the vector, in f32, into `out` (of the same length).
    pub fn copy_to(&self, out: &mut [f32]) {
        match self {
            Stored::F32(v) => out.copy_from_slice(v),
            Stored::F16(v) => v.convert_to_f32_slice(out),
        }
    }
}

/// A node's vector tuple, read in place.
pub struct Tuple<'a> {
    pub header: VectorHeader,
    pub vector: Stored<'a>,
}

impl<'a> Tuple<'a> {
    /// A vector tuple's bytes, read in place: a page's, or a row the
    /// change log carried (`PageRef::tuple_bytes`), in `element`.
    pub fn decode(bytes: &'a [u8], element: Element) -> Tuple<'a> {
        let (header, vector) = bytes.split_at(VECTOR_HEADER);
        let vector = match element {
            Element::F32 => Stored::F32(words(vector)),
            Element::F16 => Stored::F16(words(vector)),
        };
        Tuple { header: VectorHeader::decode(header), vector }
    }

    /// What a search's visit of this node finds: None for a free slot, else
    /// `dist` of its vector (decoded into `scratch` where it is f16), its
    /// payload and whether it is deleted.
    pub fn visit(&self, scratch: &mut Vec<f32>, dist: impl FnOnce(&[f32]) -> f32) -> Option<Visit> {
        if self.header.flags & FLAG_FREE != 0 {
            return None;
        }
        let deleted = self.header.flags & FLAG_DELETED != 0;
        Some(Visit { dist: self.vector.with_f32(scratch, dist), payload: self.header.payload(), deleted })
    }
}

/// Where a node's list lies in its graph page's contents.
fn list_range(layout: &Layout, node: u32) -> Range<usize> {
    let start = node as usize % layout.per_chunk * 4 * layout.degree;
    start..start + 4 * layout.degree
}

/// Where a node's vector tuple lies in its vector page's contents.
fn tuple_range(layout: &Layout, node: u32) -> Range<usize> {
    let start = node as usize % layout.per_chunk % layout.per_vector_page * layout.vector_size();
    start..start + layout.vector_size()
}

/// The values a page holds in place: u32 (lists), f32 and f16 (vectors);
/// every bit pattern is a value of each.
trait Word: Copy {}
impl Word for u32 {}
impl Word for f32 {}
impl Word for f16 {}

fn words<T: Word>(bytes: &[u8]) -> &[T] {
    // SAFETY: T is u32, f32 or f16 (the private trait Word), for which every
    // bit pattern is a value; align_to leaves any misaligned bytes in the prefix
    // and suffix, which the assert rules out.
    let (head, words, tail) = unsafe { bytes.align_to::<T>() };
    assert!(head.is_empty() && tail.is_empty(), "gpu_graph: misaligned page contents");
    words
}

fn words_mut<T: Word>(bytes: &mut [u8]) -> &mut [T] {
    // SAFETY: as in `words`; any value written through a `&mut [T]` is a
    // valid byte pattern too.
    let (head, words, tail) = unsafe { bytes.align_to_mut::<T>() };
    assert!(head.is_empty() && tail.is_empty(), "gpu_graph: misaligned page contents");
    words
}

/// A page image, read.
#[derive(Clone, Copy)]
pub struct PageRef<'a> {
    contents: &'a [u8],
}

impl<'a> PageRef<'a> {
    /// # Safety
    /// `page` must point at a MAXALIGNed BLCKSZ page image that nothing
    /// writes while `'a` lasts (its buffer's content lock held that long, and
    /// no change of this process's own landing in it meanwhile).
    pub unsafe fn new(page: pg_sys::Page) -> PageRef<'a> {
        // SAFETY: the page is BLCKSZ readable bytes, left unchanged for 'a
        // (the caller's contract); the contents are its last USABLE bytes.
        let contents = unsafe { std::slice::from_raw_parts((page as *const u8).add(PAGE_HEADER), USABLE) };
        PageRef { contents }
    }

    /// The meta page's contents (unchecked: see `Meta::read` for the check).
    pub fn meta(&self) -> Meta {
        meta_from(self.meta_bytes()).expect("a page holds a meta page's bytes")
    }

    /// The bytes of the meta page that hold its [`Meta`] (what the change
    /// log carries of a change of the meta page).
    pub fn meta_bytes(&self) -> &'a [u8] {
        &self.contents[..std::mem::size_of::<Meta>()]
    }

    /// A node's list: all `degree` slots, those after its last neighbour
    /// [`NO_NODE`].
    pub fn list(&self, layout: &Layout, node: u32) -> &'a [u32] {
        words(&self.contents[list_range(layout, node)])
    }

    /// A node's neighbours: its list up to the first unused slot.
    pub fn neighbors(&self, layout: &Layout, node: u32) -> impl Iterator<Item = u32> + 'a {
        self.list(layout, node).iter().copied().take_while(|&n| n != NO_NODE)
    }

    /// A node's vector tuple.
    pub fn tuple(&self, layout: &Layout, node: u32) -> Tuple<'a> {
        Tuple::decode(self.tuple_bytes(layout, node), layout.element)
    }

    /// A node's vector tuple as bytes ([`Tuple::decode`] reads them).
    pub fn tuple_bytes(&self, layout: &Layout, node: u32) -> &'a [u8] {
        &self.contents[tuple_range(layout, node)]
    }
}

/// The [`Meta`] in `bytes` (a meta page's [`PageRef::meta_bytes`]), unless
/// they are of another length (unchecked otherwise: see `Meta::read`).
pub fn meta_from(bytes: &[u8]) -> Option<Meta> {
    // SAFETY: `bytes` holds size_of::<Meta>() readable bytes, and Meta is
    // plain integers and floats (repr(C)), valid for any bit pattern;
    // read_unaligned needs no alignment.
    (bytes.len() == std::mem::size_of::<Meta>())
        .then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const Meta) })
}

/// A page image, written.
pub struct PageMut<'a> {
    page: &'a mut [u8],
}

impl<'a> PageMut<'a> {
    /// # Safety
    /// `page` must point at a MAXALIGNed BLCKSZ page image that no one else
    /// reads or writes while `'a` lasts (a buffer locked exclusively, or
    /// a WAL record's copy of one).
    pub unsafe fn new(page: pg_sys::Page) -> PageMut<'a> {
        // SAFETY: the page is BLCKSZ bytes this view alone uses for 'a (the
        // caller's contract).
        let page = unsafe { std::slice::from_raw_parts_mut(page as *mut u8, BLCKSZ) };
        PageMut { page }
    }

    #[cfg(test)]
    pub fn as_ref(&self) -> PageRef<'_> {
        PageRef { contents: &self.page[PAGE_HEADER..] }
    }

    fn contents(&mut self) -> &mut [u8] {
        &mut self.page[PAGE_HEADER..]
    }

    /// Formats the page as an index page whose whole contents area is data,
    /// all zero.
    pub fn init(&mut self) {
        // SAFETY: PageInit writes the BLCKSZ bytes this view holds.
        unsafe { pg_sys::PageInit(self.page.as_mut_ptr() as pg_sys::Page, BLCKSZ, 0) };
        let lower = std::mem::offset_of!(pg_sys::PageHeaderData, pd_lower);
        self.page[lower..lower + 2].copy_from_slice(&(BLCKSZ as u16).to_ne_bytes());
    }

    /// Writes the meta page's contents.
    pub fn put_meta(&mut self, meta: &Meta) {
        let bytes = &mut self.contents()[..std::mem::size_of::<Meta>()];
        // SAFETY: `bytes` holds size_of::<Meta>() writable bytes;
        // write_unaligned needs no alignment.
        unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr() as *mut Meta, *meta) };
    }

    /// Formats a new meta page holding `meta`.
    pub fn format_meta(&mut self, meta: &Meta) {
        self.init();
        self.put_meta(meta);
    }

    /// Formats page `index_in_chunk` of a new chunk: the graph page with
    /// every list empty, or a vector page whose every slot is free.
    pub fn format_chunk_page(&mut self, index_in_chunk: usize, layout: &Layout) {
        self.init();
        let c = self.contents();
        if index_in_chunk == 0 {
            words_mut::<u32>(&mut c[..4 * layout.degree * layout.per_chunk]).fill(NO_NODE);
        } else {
            let free = VectorHeader::new(0, FLAG_FREE);
            for slot in c.chunks_exact_mut(layout.vector_size()).take(layout.per_vector_page) {
                free.encode(&mut slot[..VECTOR_HEADER]);
            }
        }
    }

    /// Writes a node's list, padded with [`NO_NODE`] (at most `degree` are kept).
    pub fn put_list(&mut self, layout: &Layout, node: u32, list: &[u32]) {
        let out = words_mut::<u32>(&mut self.contents()[list_range(layout, node)]);
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = list.get(i).copied().unwrap_or(NO_NODE);
        }
    }

    /// Writes a node's vector tuple (its vector rounded to f16 when the
    /// layout stores f16).
    pub fn put_tuple(&mut self, layout: &Layout, node: u32, payload: u64, flags: u16, v: &[f32]) {
        let (header, vector) = self.contents()[tuple_range(layout, node)].split_at_mut(VECTOR_HEADER);
        VectorHeader::new(payload, flags).encode(header);
        match layout.element {
            Element::F32 => words_mut::<f32>(vector).copy_from_slice(v),
            Element::F16 => words_mut::<f16>(vector).convert_from_f32_slice(v),
        }
    }

    /// Rewrites a node's vector header (its vector stays).
    pub fn put_header(&mut self, layout: &Layout, node: u32, payload: u64, flags: u16) {
        let header = &mut self.contents()[tuple_range(layout, node)][..VECTOR_HEADER];
        VectorHeader::new(payload, flags).encode(header);
    }

    /// Changes the flags of a node's vector tuple; returns the old flags.
    pub fn set_flags(&mut self, layout: &Layout, node: u32, f: impl FnOnce(u16) -> u16) -> u16 {
        let header = &mut self.contents()[tuple_range(layout, node)][..VECTOR_HEADER];
        let mut h = VectorHeader::decode(header);
        let old = h.flags;
        h.flags = f(old);
        h.encode(header);
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A MAXALIGNed page image in memory.
    #[repr(C, align(8))]
    struct Image([u8; BLCKSZ]);

    #[test]
    fn lists_and_tuples_round_trip() {
        let layout = Layout::new(8, 3, Element::F32);
        let mut img = Box::new(Image([0xAA; BLCKSZ]));
        let page = img.0.as_mut_ptr() as pg_sys::Page;
        // SAFETY: `img` is a MAXALIGNed BLCKSZ image used only through this view.
        let mut w = unsafe { PageMut::new(page) };
        // the header is left as it was: PageInit is PostgreSQL's, not linked into unit tests
        w.contents().fill(0);
        let node = layout.per_chunk as u32 + 2;
        w.put_list(&layout, node, &[4, 5, 6]);
        w.put_tuple(&layout, node, 0x0001_0002_0003, 0, &[1.0, 2.0, 3.0]);
        let r = w.as_ref();
        assert_eq!(r.list(&layout, node), &[4, 5, 6, NO_NODE, NO_NODE, NO_NODE, NO_NODE, NO_NODE]);
        assert_eq!(r.neighbors(&layout, node).collect::<Vec<_>>(), vec![4, 5, 6]);
        let t = r.tuple(&layout, node);
        let mut v = [0f32; 3];
        t.vector.copy_to(&mut v);
        assert_eq!((t.header.payload(), t.header.flags, v), (0x0001_0002_0003, 0, [1.0f32, 2.0, 3.0]));
        assert_eq!(w.set_flags(&layout, node, |f| f | 1), 0);
        assert_eq!(w.as_ref().tuple(&layout, node).header.flags, 1);
    }

    #[test]
    fn f16_tuples_round_to_nearest_and_take_half() {
        let (l32, l16) = (Layout::new(8, 5, Element::F32), Layout::new(8, 5, Element::F16));
        assert_eq!((l32.vector_size(), l16.vector_size()), (28, 18));
        let mut img = Box::new(Image([0; BLCKSZ]));
        // SAFETY: `img` is a MAXALIGNed BLCKSZ image used only through this view.
        let mut w = unsafe { PageMut::new(img.0.as_mut_ptr() as pg_sys::Page) };
        let x = [1.0f32, -2.5, 0.1, 65504.0, 1e-8];
        w.put_tuple(&l16, 7, 42, 0, &x);
        let t = w.as_ref().tuple(&l16, 7);
        assert!(matches!(t.vector, Stored::F16(_)));
        let mut v = [0f32; 5];
        t.vector.copy_to(&mut v);
        let expected: Vec<f32> = x.iter().map(|&a| f16::from_f32(a).to_f32()).collect();
        assert_eq!(v.to_vec(), expected);
        assert_eq!(v[..2], [1.0, -2.5]);
        assert!((v[2] - 0.1).abs() < 1e-4);
        let mut scratch = Vec::new();
        assert_eq!(t.vector.with_f32(&mut scratch, |s| s.to_vec()), expected);
    }

    #[test]
    fn header_bytes_are_three_tid_words_then_flags() {
        let mut b = [0u8; VECTOR_HEADER];
        VectorHeader { tid: [1, 2, 3], flags: 4 }.encode(&mut b);
        let words: Vec<u16> = b.chunks(2).map(|c| u16::from_ne_bytes([c[0], c[1]])).collect();
        assert_eq!(words, vec![1, 2, 3, 4]);
        let tid = payload_to_tid(VectorHeader::decode(&b).payload());
        assert_eq!((tid.ip_blkid.bi_hi, tid.ip_blkid.bi_lo, tid.ip_posid), (1, 2, 3));
    }
}
