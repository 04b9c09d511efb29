//! Named tags and the calling thread's tag.
//!
//! A collective's tag ([`crate::flight::OpRecord::tag`], `sncl::CollConfig::tag`,
//! `snclCollConfig_t.userTag`) is a `u64`; profilers and frameworks name their
//! scopes with strings (PyTorch's `record_function`, NVTX ranges). [`tag_of`]
//! turns a name into its tag (a stable 64-bit hash, the same in every process
//! and on every rank) and remembers the name, so the flight recorder's dumps,
//! `commbench trace` and the statistics can print it ([`name_of`]).
//!
//! [`set_thread_tag`] gives the calling thread a tag that every collective it
//! issues without a tag of its own carries, as an NVTX range marks what runs
//! inside it: a framework sets it around a phase of its step, and needs no
//! per-call settings for it.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Names remembered at most (a program that names every call differently
/// still gets its tags; only the names beyond this are not printed).
pub const MAX_NAMES: usize = 4096;

/// Longest name kept, bytes (longer ones are cut at a character boundary).
pub const MAX_NAME_BYTES: usize = 128;

fn names() -> &'static Mutex<HashMap<u64, String>> {
    static NAMES: OnceLock<Mutex<HashMap<u64, String>>> = OnceLock::new();
    NAMES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The tag of `name`: FNV-1a of its bytes (never 0, which means "no tag"),
/// the same on every rank; the name is remembered for [`name_of`].
pub fn tag_of(name: &str) -> u64 {
    let tag = comm_core::hash::fnv1a(name.bytes()).max(1);
    let mut kept = names().lock().unwrap_or_else(|e| e.into_inner());
    if kept.len() < MAX_NAMES || kept.contains_key(&tag) {
        let mut end = name.len().min(MAX_NAME_BYTES);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        kept.entry(tag).or_insert_with(|| name[..end].to_string());
    }
    tag
}

/// The name [`tag_of`] was given for `tag` in this process, if any.
pub fn name_of(tag: u64) -> Option<String> {
    if tag == 0 {
        return None;
    }
    names()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&tag)
        .cloned()
}

thread_local! {
    static THREAD_TAG: Cell<u64> = const { Cell::new(0) };
}

/// Sets the calling thread's tag (0: none) and returns the one it replaces:
/// collectives this thread issues without a tag of their own carry it.
pub fn set_thread_tag(tag: u64) -> u64 {
    THREAD_TAG.with(|t| t.replace(tag))
}

/// The calling thread's tag ([`set_thread_tag`]; 0: none).
pub fn thread_tag() -> u64 {
    THREAD_TAG.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_has_one_nonzero_tag_and_is_remembered() {
        let a = tag_of("backward/bucket 3");
        assert_eq!(a, tag_of("backward/bucket 3"));
        assert_ne!(a, tag_of("backward/bucket 4"));
        assert_ne!(a, 0);
        // FNV-1a of the empty string is its offset basis.
        assert_eq!(tag_of(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(name_of(a).as_deref(), Some("backward/bucket 3"));
        assert_eq!(name_of(0), None);
        assert_eq!(name_of(12345), None);
        let long = "é".repeat(100);
        let kept = name_of(tag_of(&long)).unwrap();
        assert!(
            kept.len() <= MAX_NAME_BYTES && long.starts_with(&kept),
            "{kept}"
        );
    }

    #[test]
    fn the_thread_tag_is_the_calling_threads_own() {
        assert_eq!(set_thread_tag(7), 0);
        assert_eq!(thread_tag(), 7);
        std::thread::spawn(|| assert_eq!(thread_tag(), 0))
            .join()
            .unwrap();
        assert_eq!(set_thread_tag(0), 7);
    }
}
