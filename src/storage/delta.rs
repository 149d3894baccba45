//! A page's change as the fragments of PostgreSQL's generic WAL records
//! (generic_xlog.c: each an offset and a length, two bytes each, then the
//! bytes), which `generic_redo` applies on replicas and in recovery.
//!
//! GenericXLogFinish finds them byte by byte over the whole 8 KB page
//! (computeRegionDelta): a quarter of an INSERT's CPU, which changes 30-odd
//! pages, and done while the page is locked exclusively. Here 64-byte
//! blocks are compared first (vectorised) and only a differing block word
//! by word; fragments are whole words, a few unchanged bytes more at most.

/// Bytes compared at once before looking closer.
const BLOCK: usize = 64;
/// The unit of a fragment.
const WORD: usize = 8;

/// Appends to `out` the fragments that turn `old` into `new` (two page
/// images of equal length, at most 64 KB: offsets are two bytes).
pub fn page_delta(old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    assert!(old.len() == new.len() && new.len() <= u16::MAX as usize + 1);
    let end = new.len();
    // the fragment open (start, end): a gap of one word is written through
    // rather than a header of four bytes spent on a new one
    let mut open: Option<(usize, usize)> = None;
    let mut push = |(s, e): (usize, usize)| {
        out.extend_from_slice(&(s as u16).to_ne_bytes());
        out.extend_from_slice(&((e - s) as u16).to_ne_bytes());
        out.extend_from_slice(&new[s..e]);
    };
    let mut i = 0;
    while i < end {
        let b = (i + BLOCK).min(end);
        if old[i..b] != new[i..b] {
            let mut w = i;
            while w < b {
                let e = (w + WORD).min(b);
                if old[w..e] != new[w..e] {
                    open = match open {
                        Some((s, oe)) if w - oe <= WORD => Some((s, e)),
                        other => {
                            if let Some(f) = other {
                                push(f);
                            }
                            Some((w, e))
                        }
                    };
                }
                w = e;
            }
        }
        i = b;
    }
    if let Some(f) = open {
        push(f);
    }
}

/// Applies fragments to a page image as generic_xlog.c's applyPageRedo
/// does (what a replica does with them; for the tests).
#[cfg(test)]
pub fn apply(page: &mut [u8], mut delta: &[u8]) {
    while !delta.is_empty() {
        let offset = u16::from_ne_bytes([delta[0], delta[1]]) as usize;
        let length = u16::from_ne_bytes([delta[2], delta[3]]) as usize;
        page[offset..offset + length].copy_from_slice(&delta[4..4 + length]);
        delta = &delta[4 + length..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fragments that rebuild `new` from `old`; their total size.
    fn check(old: &[u8], new: &[u8]) -> usize {
        let mut d = Vec::new();
        page_delta(old, new, &mut d);
        let mut page = old.to_vec();
        apply(&mut page, &d);
        assert_eq!(page, new);
        d.len()
    }

    #[test]
    fn fragments_rebuild_the_page() {
        let old: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(check(&old, &old), 0);
        // one byte, at either end and in between
        for at in [0, 1, 63, 64, 4095, 8190, 8191] {
            let mut new = old.clone();
            new[at] ^= 0x5a;
            assert_eq!(check(&old, &new), 4 + WORD, "byte {at}");
        }
        // a list of 32 ids rewritten: one fragment of its words
        let mut new = old.clone();
        new[1000..1128].iter_mut().for_each(|b| *b = !*b);
        assert!(check(&old, &new) <= 4 + 128 + 2 * WORD);
        // changes two words apart are one fragment, further apart two
        let mut new = old.clone();
        new[16] ^= 1;
        new[32] ^= 1;
        assert_eq!(check(&old, &new), 4 + 3 * WORD);
        new[200] ^= 1;
        assert_eq!(check(&old, &new), 2 * 4 + 4 * WORD);
        // everything
        let new: Vec<u8> = old.iter().map(|b| !b).collect();
        assert_eq!(check(&old, &new), 4 + 8192);
        // pseudo-random scattered changes
        let mut new = old.clone();
        let mut x = 12345u32;
        for _ in 0..300 {
            x = x.wrapping_mul(1103515245).wrapping_add(12345);
            new[(x >> 8) as usize % 8192] = (x >> 24) as u8;
        }
        check(&old, &new);
        // a page whose length is not whole words
        check(&old[..8190], &new[..8190]);
    }
}
