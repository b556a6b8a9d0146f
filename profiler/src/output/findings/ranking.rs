//! Why contention mode's headline can differ from full mode's on the same workload: it ranks
//! the mechanisms by the waits of their contended writes only, and which writes contend is
//! the scheduler's doing. Where the runner-up is close enough to swap places, the headline
//! says on how few contended writes its rank rests (docs/findings.md, "In contention mode").

use super::Finding;

/// The mechanisms, whose order is the story's (docs/findings.md, "Mechanisms").
const MECHANISMS: &[&str] = &[
    "thread-stacks",
    "mmap-threshold",
    "arena-growth",
    "v8-heap",
    "wasm-memory",
    "file-mappings",
    "own-mappings",
];

/// A runner-up whose wait is at least this share of the headline's could take its place in
/// another run (or in full mode, which charges every write).
const CLOSE: f64 = 0.5;

/// A headline resting on fewer contended writes than this is a small sample: a few writes
/// more or less behind a preempted holder reorder it.
const FEW_WRITES: u64 = 50;

/// In contention mode, on one process's findings in their order: the first mechanism found
/// gets a fact naming the next one when that one's wait is close to its own or its own rests
/// on few contended writes, with both counts and what full mode ranks by.
pub fn note_close_ranks(findings: &mut [Finding]) {
    let mut mech = findings
        .iter()
        .enumerate()
        .filter(|(_, f)| MECHANISMS.contains(&f.id.as_str()));
    let (Some((first, _)), Some((_, next))) = (mech.next(), mech.next()) else {
        return;
    };
    let head = &findings[first];
    let close = (next.wait_ns as f64) >= CLOSE * head.wait_ns as f64;
    if head.wait_ns == 0 || !(close || head.writes.unwrap_or(0) < FEW_WRITES) {
        return;
    }
    let fact = format!(
        "ranked above {} on contended writes only ({} against {}, their waits {} against {}): \
         which writes contend changes from run to run, and full mode (`--mode full`), which \
         charges every write, can rank them the other way",
        next.id,
        head.writes.unwrap_or(0),
        next.writes.unwrap_or(0),
        crate::output::text::fmt_ns(head.wait_ns),
        crate::output::text::fmt_ns(next.wait_ns),
    );
    findings[first].evidence.facts.push(fact);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(id: &str, writes: u64, wait_ns: u64) -> Finding {
        serde_json::from_value(serde_json::json!({
            "id": id, "pid": 1, "comm": "node", "severity": "low", "title": id,
            "writes": writes, "wait_ns": wait_ns, "share_of_wait": 0.1, "time_share": null,
        }))
        .unwrap()
    }

    fn facts(f: &Finding) -> Vec<&str> {
        f.evidence.facts.iter().map(String::as_str).collect()
    }

    #[test]
    fn a_close_runner_up_is_named_on_the_headline_with_both_counts() {
        let mut f = vec![
            finding("not-your-bottleneck", 0, 0),
            finding("mmap-threshold", 12, 9_000_000),
            finding("long-holds", 30, 8_000_000),
            finding("thread-stacks", 40, 6_000_000),
        ];
        note_close_ranks(&mut f);
        let said = facts(&f[1]);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].starts_with(
                "ranked above thread-stacks on contended writes only (12 against 40, their waits 9.00ms against 6.00ms)"
            ),
            "{said:?}"
        );
        assert!(
            f.iter()
                .enumerate()
                .all(|(i, g)| i == 1 || g.evidence.facts.is_empty())
        );
    }

    #[test]
    fn a_distant_runner_up_behind_many_writes_or_a_lone_mechanism_says_nothing() {
        let mut f = vec![
            finding("thread-stacks", 400, 9_000_000),
            finding("mmap-threshold", 120, 4_000_000),
        ];
        note_close_ranks(&mut f);
        assert!(f.iter().all(|g| g.evidence.facts.is_empty()));
        // The same order on a dozen contended writes: a small sample, said.
        f[0].writes = Some(12);
        note_close_ranks(&mut f);
        assert_eq!(facts(&f[0]).len(), 1);
        let mut f = vec![
            finding("thread-stacks", 40, 9_000_000),
            finding("long-holds", 9, 9_000_000),
        ];
        note_close_ranks(&mut f);
        assert!(f.iter().all(|g| g.evidence.facts.is_empty()));
    }
}
