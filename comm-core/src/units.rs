//! Byte counts as people write them, one parser for the workspace:
//! `8`, `64K`, `16M`, `1G` (powers of 1024; `KiB`, `MiB`, `GiB` too).
//! commbench's size flags and every byte-valued `SNCL_*` setting read
//! through it.

/// Parses a byte count; `None` for anything else (a suffix without a
/// number, a fraction, an overflow).
pub fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let lower = s.to_ascii_lowercase();
    let (num, shift) = [
        ("gib", 30),
        ("mib", 20),
        ("kib", 10),
        ("g", 30),
        ("m", 20),
        ("k", 10),
    ]
    .iter()
    .find_map(|(suffix, shift)| lower.strip_suffix(suffix).map(|n| (n, *shift)))
    .unwrap_or((&lower, 0));
    let n: usize = num.trim_end().parse().ok()?;
    n.checked_mul(1usize << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_and_without_suffixes() {
        assert_eq!(parse_bytes("8"), Some(8));
        assert_eq!(parse_bytes(" 64K "), Some(64 << 10));
        assert_eq!(parse_bytes("16m"), Some(16 << 20));
        assert_eq!(parse_bytes("1G"), Some(1 << 30));
        assert_eq!(parse_bytes("4MiB"), Some(4 << 20));
        assert_eq!(parse_bytes("2 KiB"), Some(2 << 10));
        for bad in ["", "K", "1.5M", "-1", "12Q", "99999999999999999999G"] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
    }
}
