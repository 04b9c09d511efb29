//! The README's algorithm list is the algorithm table: the block between
//! the markers must be exactly what `expected_block` generates from
//! `comm_core::algo::ALGORITHMS` (on a mismatch the test prints the block to
//! paste), and the rest of the README names no algorithm list of its own.

use comm_core::algo::{self, Algorithm};
use comm_core::wire::Collective;

const BEGIN: &str =
    "<!-- algorithms: generated from comm_core::algo::ALGORITHMS, checked by comm-core/tests/readme_algorithms.rs -->";
const END: &str = "<!-- end of algorithms -->";

fn expected_block() -> String {
    let mut s = String::new();
    s.push_str(BEGIN);
    s.push('\n');
    s.push_str("| operation | algorithms |\n|---|---|\n");
    for coll in Collective::ALL.into_iter().filter(|c| c.is_scheduled()) {
        let rows: Vec<String> = algo::rows(coll)
            .map(|r| {
                let d = r.describe();
                match d.split_once(' ') {
                    Some((name, rest)) => format!("`{name}` {rest}"),
                    None => format!("`{d}`"),
                }
            })
            .collect();
        s.push_str(&format!("| `{}` | {} |\n", coll.name(), rows.join(", ")));
    }
    s.push_str(END);
    s
}

fn readme() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

#[test]
fn readme_lists_exactly_the_tables_algorithms() {
    let text = readme();
    let want = expected_block();
    let start = text
        .find(BEGIN)
        .unwrap_or_else(|| panic!("README.md lacks the algorithm block; add:\n{want}"));
    let end = text[start..]
        .find(END)
        .map(|e| start + e + END.len())
        .unwrap_or_else(|| panic!("README.md's algorithm block has no end marker {END:?}"));
    let got = &text[start..end];
    assert_eq!(
        got, want,
        "README.md's algorithm list differs from the table; replace the block with:\n{want}"
    );
    // Every algorithm name of the table is in the block, and no other
    // backticked name is.
    let names: Vec<&str> = got
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| Collective::from_name(w).is_none())
        .collect();
    for a in Algorithm::ALL {
        assert!(
            names.contains(&a.name()),
            "{} missing from README",
            a.name()
        );
    }
    for n in &names {
        assert!(
            Algorithm::from_name(n).is_some(),
            "README lists {n:?}, which is no algorithm"
        );
    }
}

/// Outside the generated block, the README does not enumerate algorithms
/// in parentheses the way the old `SNCL_ALGO` row did ("(ring, tree, rd,
/// pairwise)"), which drifted from the code.
#[test]
fn no_hand_written_algorithm_list_elsewhere() {
    let text = readme();
    let (Some(start), Some(end)) = (text.find(BEGIN), text.find(END)) else {
        panic!("README.md lacks the algorithm block");
    };
    let outside = format!("{}{}", &text[..start], &text[end..]);
    for paren in outside
        .split('(')
        .skip(1)
        .filter_map(|p| p.split(')').next())
    {
        let words: Vec<&str> = paren
            .split([',', ' '])
            .filter(|w| !w.is_empty() && *w != "or" && *w != "and")
            .collect();
        let algos = words
            .iter()
            .filter(|w| Algorithm::from_name(w.trim_matches('`')).is_some())
            .count();
        assert!(
            algos < 2,
            "README.md lists algorithms by hand in ({paren}); point to the Algorithms table instead"
        );
    }
}
