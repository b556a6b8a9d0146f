//! The container runtime's own processes in a container's cgroup, as the agent labels them.
//! runc starts each container with `runc init`, which renames itself `runc:[0:PARENT]` and
//! forks `runc:[1:CHILD]`, which forks `runc:[2:INIT]`, which execs the container's
//! command: four names, each a few dozen writes, all under the container's cgroup and so all
//! selected with it. They are one `runc` process in the metrics: a container adds one
//! runtime series set, not four, and the image's own process keeps its name.

/// The `process` label for command name `comm`.
pub fn process_label(comm: &str) -> &str {
    if is_runc_stage(comm) { "runc" } else { comm }
}

/// `runc:[N:STAGE]`, the names runc's nsexec gives its stages.
fn is_runc_stage(comm: &str) -> bool {
    comm.strip_prefix("runc:[")
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|r| r.split_once(':'))
        .is_some_and(|(n, stage)| {
            !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
                && !stage.is_empty()
                && stage.bytes().all(|b| b.is_ascii_uppercase())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runcs_stages_are_one_runc_process() {
        for stage in ["runc:[0:PARENT]", "runc:[1:CHILD]", "runc:[2:INIT]", "runc"] {
            assert_eq!(process_label(stage), "runc", "{stage}");
        }
        for other in [
            "node",
            "runc:[x:INIT]",
            "runc:[2:]",
            "runc:[2:INIT",
            "runcd",
            "mmap-churn",
        ] {
            assert_eq!(process_label(other), other, "{other}");
        }
    }
}
