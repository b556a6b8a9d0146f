//! Where sampled stacks end, in words: `stack_ends`' keys (`root`, `unreadable_memory`, ...)
//! are the JSON's names, which mean nothing to a reader of the text.

use std::{collections::BTreeMap, fmt::Write as _};

use crate::output::report::StackCutReport;

/// The threads and files a reason's line names at most (`stack_cuts`' largest rows).
const CUTS_SAID: usize = 3;

/// What a `stack_ends` key means, said of the stacks that end so; the key itself for one
/// this build does not know (a later build's file).
pub fn stack_end_words(key: &str) -> &str {
    match key {
        "root" => "complete: they reach the thread's first frame",
        "unreadable_memory" => {
            "cut: the stack goes deeper than the 16 KiB copied at the sample, or a frame pointer led out of it (code without frame pointers or unwind tables)"
        }
        "no_unwind_info" => {
            "cut: code with no unwind information and no frame pointer to follow (built without unwind tables, as many prebuilt native libraries are)"
        }
        "depth_limit" => "cut at the 64 frames kept",
        "unknown_mapping" => "cut: a return address in no mapping of the process",
        "no_process" => "not unwound: the process was gone before its stacks were read",
        other => other,
    }
}

/// The text's lines on where a process's sampled stacks end: one line when all are
/// complete, else one per reason, most stacks first, each with its JSON key and under it
/// whose stacks stop so and in which file (`cuts`, the largest first).
pub fn stack_ends_text(ends: &BTreeMap<String, u64>, cuts: &[StackCutReport]) -> String {
    let total: u64 = ends.values().sum();
    if total == 0 {
        return String::new();
    }
    let complete = ends.get("root").copied().unwrap_or(0);
    if complete == total {
        return if total == 1 {
            "\n  sampled stacks: the one is complete (it reaches the thread's first frame)\n".into()
        } else {
            format!(
                "\n  sampled stacks: all {total} complete (they reach the thread's first frame)\n"
            )
        };
    }
    let mut rows: Vec<(&String, u64)> = ends
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| (k, *n))
        .collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut out =
        format!("\n  sampled stacks: {complete} of {total} complete; where the others end:\n");
    for (key, n) in rows.into_iter().filter(|(k, _)| *k != "root") {
        let _ = writeln!(out, "    {n:>7}  {} ({key})", stack_end_words(key));
        let whose: Vec<String> = (cuts.iter().filter(|c| c.end == *key))
            .take(CUTS_SAID)
            .map(|c| {
                let comm = if c.comm.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", c.comm)
                };
                format!(
                    "{} in {} on {} threads{comm}",
                    c.stacks,
                    c.stops_in,
                    c.role.as_str()
                )
            })
            .collect();
        if !whose.is_empty() {
            let _ = writeln!(out, "             stopping: {}", whose.join("; "));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_ends_are_said_in_words_with_their_keys() {
        let ends = |v: &[(&str, u64)]| {
            v.iter()
                .map(|(k, n)| (k.to_string(), *n))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(
            stack_ends_text(&ends(&[("root", 108)]), &[]),
            "\n  sampled stacks: all 108 complete (they reach the thread's first frame)\n"
        );
        assert!(stack_ends_text(&ends(&[("root", 1)]), &[]).contains("the one is complete"));
        let text = stack_ends_text(
            &ends(&[
                ("root", 1),
                ("unreadable_memory", 10),
                ("depth_limit", 2),
                ("a_later_reason", 3),
            ]),
            &[],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "  sampled stacks: 1 of 16 complete; where the others end:"
        );
        assert_eq!(
            lines[2],
            "         10  cut: the stack goes deeper than the 16 KiB copied at the sample, or a frame pointer led out of it (code without frame pointers or unwind tables) (unreadable_memory)"
        );
        assert_eq!(lines[3], "          3  a_later_reason (a_later_reason)");
        assert_eq!(
            lines[4],
            "          2  cut at the 64 frames kept (depth_limit)"
        );
        assert_eq!(lines.len(), 5, "{text}");
        assert_eq!(stack_ends_text(&BTreeMap::new(), &[]), "");
    }

    /// Under each reason, whose stacks stop so and in which file, the largest first.
    #[test]
    fn a_reason_names_the_threads_and_the_file_its_stacks_stop_in() {
        use crate::registry::roles::Role;
        let cut = |role, comm: &str, end: &str, file: &str, stacks| StackCutReport {
            role,
            comm: comm.into(),
            end: end.into(),
            stops_in: file.into(),
            stacks,
        };
        let ends = [
            ("root".to_string(), 33),
            ("no_unwind_info".to_string(), 311),
        ]
        .into_iter()
        .collect();
        let cuts = [
            cut(
                Role::Addon,
                "libvips worker",
                "no_unwind_info",
                "libvips-cpp.so.8",
                250,
            ),
            cut(
                Role::Libuv,
                "node",
                "no_unwind_info",
                "libvips-cpp.so.8",
                61,
            ),
            cut(Role::Main, "node", "depth_limit", "node", 1),
        ];
        let text = stack_ends_text(&ends, &cuts);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[2].ends_with("(no_unwind_info)"), "{text}");
        assert_eq!(
            lines[3],
            "             stopping: 250 in libvips-cpp.so.8 on addon threads (libvips worker); 61 in libvips-cpp.so.8 on libuv threads (node)"
        );
        assert_eq!(lines.len(), 4, "{text}");
    }
}
