//! Buffers with their lock held, and GenericXLog records over them.
//!
//! Every page of the index uses the whole area after the page header as
//! contents, with pd_lower = pd_upper = BLCKSZ so that neither GenericXLog nor
//! log_newpage_range mistakes any of it for a hole.

use pgrx::pg_sys;

use super::layout::{BLCKSZ, PAGE_HEADER};

/// A pinned buffer with its content lock held; both released on drop.
pub struct Locked {
    pub buf: pg_sys::Buffer,
}

impl Locked {
    /// # Safety
    /// `rel` must be an open index relation and `block` exist in it.
    pub unsafe fn read(rel: pg_sys::Relation, block: u32, exclusive: bool) -> Locked {
        let buf = pg_sys::ReadBufferExtended(
            rel,
            pg_sys::ForkNumber::MAIN_FORKNUM,
            block,
            pg_sys::ReadBufferMode::RBM_NORMAL,
            std::ptr::null_mut(),
        );
        let mode = if exclusive { pg_sys::BUFFER_LOCK_EXCLUSIVE } else { pg_sys::BUFFER_LOCK_SHARE };
        pg_sys::LockBuffer(buf, mode as i32);
        Locked { buf }
    }

    /// The page's contents (after the header), read-only view.
    pub fn contents(&self) -> *const u8 {
        unsafe { (pg_sys::BufferGetPage(self.buf) as *const u8).add(PAGE_HEADER) }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        // on an ERROR, PostgreSQL's abort releases locks and pins itself
        if !std::thread::panicking() {
            unsafe { pg_sys::UnlockReleaseBuffer(self.buf) };
        }
    }
}

/// Formats a page as an index page whose whole contents area is data.
///
/// # Safety
/// `page` must point at BLCKSZ writable bytes.
pub unsafe fn init_page(page: pg_sys::Page) {
    pg_sys::PageInit(page, BLCKSZ, 0);
    let header = page as *mut pg_sys::PageHeaderData;
    (*header).pd_lower = BLCKSZ as u16;
}

/// Contents pointer of a page image.
pub fn page_contents(page: pg_sys::Page) -> *mut u8 {
    unsafe { (page as *mut u8).add(PAGE_HEADER) }
}

/// One GenericXLog record over up to four locked buffers.
pub struct Xlog {
    state: *mut pg_sys::GenericXLogState,
}

impl Xlog {
    /// # Safety
    /// `rel` must be an open index relation.
    pub unsafe fn start(rel: pg_sys::Relation) -> Xlog {
        Xlog { state: pg_sys::GenericXLogStart(rel) }
    }
    /// Registers a buffer locked exclusively by the caller; returns the page
    /// image to modify. `fresh` logs the full image (a new page).
    pub fn register(&mut self, locked: &Locked, fresh: bool) -> pg_sys::Page {
        let flags = if fresh { pg_sys::GENERIC_XLOG_FULL_IMAGE as i32 } else { 0 };
        unsafe { pg_sys::GenericXLogRegisterBuffer(self.state, locked.buf, flags) }
    }
    pub fn finish(self) {
        unsafe { pg_sys::GenericXLogFinish(self.state) };
        std::mem::forget(self);
    }
}

impl Drop for Xlog {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            unsafe { pg_sys::GenericXLogAbort(self.state) };
        }
    }
}
