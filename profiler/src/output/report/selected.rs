//! Why a process is in a report: the selector that chose it (`--comm`, `--pid`) and how, as
//! the kernel's selection noted it.

use serde::{Deserialize, Serialize};

/// How a selected process was chosen (`selected_by` in docs/report-format.md).
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelectedBy {
    /// The `--comm` name it matched: its name at exec, the name it gave itself, its name
    /// (or its executable's) when the run began, or, forked, its parent's (`how`).
    pub comm: Option<String>,
    /// The `--pid` target it is (its own pid).
    pub pid: Option<u32>,
    pub how: SelectedHow,
}

/// When the selection took a process in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SelectedHow {
    /// At its exec: its name then was the `--comm` name.
    Exec,
    /// When it renamed itself to the `--comm` name (`process.title`, prctl).
    Rename,
    /// When the run began: it was running then (under the `--comm` name, or a `--pid`
    /// target, or one's descendant with `--children`).
    Running,
    /// At its fork, by a selected process (its parent's selection passes on).
    Fork,
    /// The COMMAND the profiler ran (`mmaplock-prof -- COMMAND`), selected before its exec.
    Command,
}

impl SelectedBy {
    /// The words of the text report: "selected by --comm node at exec".
    pub fn describe(&self) -> String {
        match (&self.comm, self.pid, self.how) {
            (Some(c), _, how) => format!(
                "selected by --comm {c} {}",
                match how {
                    SelectedHow::Exec => "at exec",
                    SelectedHow::Rename => "when it renamed itself",
                    SelectedHow::Running => "running when the run began",
                    SelectedHow::Fork => "forked by a process it selected",
                    SelectedHow::Command => "as the command run",
                }
            ),
            (None, _, SelectedHow::Command) => "the command run by the profiler".into(),
            (None, Some(pid), _) => format!("selected by --pid {pid}"),
            (None, None, SelectedHow::Fork) => {
                "forked by a followed process (--children, or the command's descendants)".into()
            }
            (None, None, _) => {
                "selected by --children, a descendant running when the run began".into()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selected_by_is_written_and_said_as_documented() {
        let renamed = SelectedBy {
            comm: Some("myapp".into()),
            pid: None,
            how: SelectedHow::Rename,
        };
        assert_eq!(
            serde_json::to_string(&renamed).unwrap(),
            r#"{"comm":"myapp","how":"rename"}"#
        );
        assert_eq!(
            renamed.describe(),
            "selected by --comm myapp when it renamed itself"
        );
        let target = SelectedBy {
            comm: None,
            pid: Some(42),
            how: SelectedHow::Running,
        };
        assert_eq!(
            serde_json::to_string(&target).unwrap(),
            r#"{"pid":42,"how":"running"}"#
        );
        assert_eq!(target.describe(), "selected by --pid 42");
        let back: SelectedBy = serde_json::from_str(r#"{"comm":"node","how":"exec"}"#).unwrap();
        assert_eq!(back.describe(), "selected by --comm node at exec");
        let child = SelectedBy {
            comm: None,
            pid: None,
            how: SelectedHow::Fork,
        };
        assert_eq!(
            child.describe(),
            "forked by a followed process (--children, or the command's descendants)"
        );
        let command = SelectedBy {
            comm: None,
            pid: Some(7),
            how: SelectedHow::Command,
        };
        assert_eq!(
            serde_json::to_string(&command).unwrap(),
            r#"{"pid":7,"how":"command"}"#
        );
        assert_eq!(command.describe(), "the command run by the profiler");
    }
}
