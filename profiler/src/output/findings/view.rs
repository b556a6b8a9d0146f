//! What the findings read of a summary line: the report's fields they need, each optional
//! with a default, so that a summary of any build (older ones have no `time_share`, no
//! stacks, no blockers) is read as it is.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Summary {
    pub duration_s: Option<f64>,
    pub stack_sample: Option<u64>,
    pub processes: Vec<Process>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Dist {
    pub sum: u64,
    pub max: u64,
    pub mean: f64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Stats {
    pub count: u64,
    pub wait_ns: Dist,
    pub hold_ns: Dist,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Cause {
    pub cause: String,
    pub write: Stats,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Share {
    pub wait_ns: u64,
    pub alive_ns: u64,
    pub wall: f64,
    pub cpu_ns: Option<u64>,
    pub cpu: Option<f64>,
    pub threads: Option<u64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct RoleShare {
    pub role: String,
    #[serde(flatten)]
    pub share: Share,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Thread {
    pub tid: u32,
    pub role: String,
    pub comm: String,
    pub pid: Option<u32>,
    pub write: Stats,
    pub read: Stats,
    pub causes: Vec<Cause>,
    pub time_share: Option<Share>,
}

impl Thread {
    pub fn wait(&self) -> u64 {
        self.write.wait_ns.sum + self.read.wait_ns.sum
    }

    /// Its writes of one cause.
    pub fn cause(&self, cause: &str) -> Option<&Stats> {
        self.causes
            .iter()
            .find(|c| c.cause == cause)
            .map(|c| &c.write)
    }

    /// The profiler's own threads (reading the process's maps): the `profiler` role, or a
    /// `foreign` thread named as the profiler is.
    pub fn is_profiler(&self) -> bool {
        self.role == "profiler"
            || (self.role == "foreign" && self.comm.starts_with("mmaplock-prof"))
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Dso {
    pub dso: String,
    pub write: Stats,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct JsFunction {
    pub function: String,
    pub file: String,
    pub writes: u64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Flame {
    pub stack: String,
    pub count: u64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct StackTop {
    pub frames: Vec<String>,
    pub count: u64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Blocker {
    pub tid: u32,
    pub pid: u32,
    pub role: String,
    pub comm: String,
    pub cause: String,
    pub waits: u64,
    pub wait_ns: u64,
    pub write_wait_ns: u64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct RoleBlock {
    pub waiter_role: String,
    pub holder_role: String,
    pub cause: String,
    pub wait_ns: u64,
    pub write_wait_ns: u64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Process {
    pub pid: u32,
    pub comm: String,
    pub write: Stats,
    pub read: Stats,
    pub causes: Vec<Cause>,
    pub threads: Vec<Thread>,
    pub dsos: Option<Vec<Dso>>,
    pub js_functions: Option<Vec<JsFunction>>,
    pub stacks: Option<Vec<StackTop>>,
    pub flame: Option<Vec<Flame>>,
    pub blockers: Option<Vec<Blocker>>,
    pub blocked_wait_ns: Option<u64>,
    pub blocked_by_role: Option<Vec<RoleBlock>>,
    pub time_share: Option<Share>,
    pub time_share_by_role: Option<Vec<RoleShare>>,
}

impl Process {
    /// All the wait (write and read) on this lock, ns.
    pub fn wait(&self) -> u64 {
        self.write.wait_ns.sum + self.read.wait_ns.sum
    }

    /// The process's own threads (not foreign takers).
    pub fn own(&self) -> impl Iterator<Item = &Thread> {
        self.threads
            .iter()
            .filter(|t| t.role != "foreign" && !t.is_profiler())
    }

    /// Wall time alive of the threads of these roles (None: the report has no time share).
    pub fn alive_of(&self, roles: &[&str]) -> Option<u64> {
        let by_role = self.time_share_by_role.as_ref()?;
        Some(
            by_role
                .iter()
                .filter(|r| roles.contains(&r.role.as_str()))
                .map(|r| r.share.alive_ns)
                .sum(),
        )
    }

    /// Writes of `cause` by threads of the roles `roles` (empty: every own thread): count,
    /// wait, and the count per role.
    pub fn writes_by(&self, cause: &str, roles: &[&str]) -> (u64, u64, BTreeMap<String, u64>) {
        let (mut n, mut wait, mut per_role) = (0, 0, BTreeMap::new());
        for t in self
            .own()
            .filter(|t| roles.is_empty() || roles.contains(&t.role.as_str()))
        {
            if let Some(s) = t.cause(cause) {
                n += s.count;
                wait += s.wait_ns.sum;
                *per_role.entry(t.role.clone()).or_default() += s.count;
            }
        }
        (n, wait, per_role)
    }

    /// Sampled write stacks, innermost frame first, with their counts: every distinct one
    /// (`flame`) or, from older reports, the longest waiting ones (`stacks`).
    pub fn sampled_stacks(&self) -> Vec<(Vec<String>, u64)> {
        if let Some(flame) = self.flame.as_ref().filter(|f| !f.is_empty()) {
            return flame
                .iter()
                .map(|f| (f.stack.rsplit(';').map(str::to_string).collect(), f.count))
                .collect();
        }
        self.stacks
            .iter()
            .flatten()
            .map(|s| (s.frames.clone(), s.count))
            .collect()
    }
}

/// The function of a `function (file)` frame.
pub fn function(frame: &str) -> &str {
    frame.rsplit_once(" (").map_or(frame, |(f, _)| f)
}

/// The file of a `function (file)` frame.
pub fn file(frame: &str) -> &str {
    frame
        .rsplit_once(" (")
        .map_or("", |(_, f)| f.trim_end_matches(')'))
}

/// The C runtime, which allocates on behalf of the code that called it.
pub fn in_c_runtime(frame: &str) -> bool {
    let f = file(frame);
    [
        "libc.so",
        "ld-linux",
        "libstdc++",
        "libgcc_s",
        "libpthread",
        "libjemalloc",
    ]
    .iter()
    .any(|r| f.starts_with(r))
}
