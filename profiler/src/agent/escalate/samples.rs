//! The crossing window's sampled stacks, from the agent's ring (what `before.pb.gz` holds):
//! the waiters' and the holders' stacks as a summary carries them (`stacks`, `flame`,
//! `js_functions`, `holder_stacks`, `holder_functions`), for the window's findings, and the
//! functions that waited and held longest, for the capture's `trigger`.

use std::collections::HashMap;

use crate::output::{
    pprof::{ProcessSamples, Samples},
    report::{
        FlameStack, FrameReport, HolderFunctionReport, JsFunctionReport, ProcessReport,
        StackReport, TriggerFunction,
    },
};

/// How many stacks and functions are kept (as a summary's `stacks`).
const TOP: usize = 10;

/// A frame as the report names it: `name (script:line:column)` for JavaScript, `function
/// (file)` for native code, the name alone otherwise.
pub fn label(f: &FrameReport) -> String {
    if let Some(script) = &f.script {
        return format!("{} ({})", f.function, location(f, script));
    }
    match &f.dso {
        Some(dso) => {
            let file = std::path::Path::new(dso)
                .file_name()
                .map_or(dso.clone(), |n| n.to_string_lossy().into_owned());
            format!("{} ({file})", f.function)
        }
        None => f.function.clone(),
    }
}

fn location(f: &FrameReport, script: &str) -> String {
    let mut at = script.to_string();
    for n in [f.line, f.column].into_iter().flatten() {
        at = format!("{at}:{n}");
    }
    at
}

/// The C runtime, which allocates on behalf of the code that called it.
fn in_c_runtime(f: &FrameReport) -> bool {
    let file = f
        .dso
        .as_deref()
        .and_then(|d| d.rsplit('/').next())
        .unwrap_or("");
    [
        "libc.so",
        "ld-linux",
        "libstdc++",
        "libgcc_s",
        "libpthread",
        "libjemalloc",
    ]
    .iter()
    .any(|r| file.starts_with(r))
}

/// A JavaScript function of the application (node's own library, `node:*`, is not).
fn application_js(f: &FrameReport) -> bool {
    f.script
        .as_deref()
        .is_some_and(|s| !s.is_empty() && !s.starts_with("node:"))
}

/// The frame a sample is charged to: the innermost JavaScript function of the application,
/// else the innermost frame outside the C runtime, else the innermost.
fn charged<'a>(frames: &[&'a FrameReport]) -> Option<&'a FrameReport> {
    (frames.iter().find(|f| application_js(f)))
        .or_else(|| frames.iter().find(|f| !in_c_runtime(f)))
        .or(frames.first())
        .copied()
}

/// The window's samples of one process, summed per stack and per function.
#[derive(Default)]
pub struct WindowSamples {
    /// Waiters' and holders' stacks (labels, innermost first) with count and wait.
    waiters: HashMap<Vec<String>, (u64, u64)>,
    holders: HashMap<Vec<String>, (u64, u64)>,
    js: HashMap<(String, String), (u64, u64)>,
    holder_js: HashMap<(String, String, String), (u64, u64)>,
    waiting: HashMap<(String, String), (u64, u64)>,
    holding: HashMap<(String, String), (u64, u64)>,
    /// Samples in all (rows' counts, cut ones included).
    pub sampled: u64,
}

impl WindowSamples {
    /// Sums the ring's window (one process's, [`Profiles::window_of`](super::super::profiles::Profiles::window_of)).
    pub fn of(window: &dyn Samples) -> WindowSamples {
        let mut s = WindowSamples::default();
        for p in window.processes() {
            s.add_process(&p);
        }
        s
    }

    fn add_process(&mut self, p: &ProcessSamples<'_>) {
        self.sampled += p.cut.count;
        for r in p.stacks {
            self.sampled += r.count;
            let frames: Vec<&FrameReport> =
                r.frames.iter().filter_map(|&i| p.frames.frame(i)).collect();
            let labels: Vec<String> = frames.iter().map(|f| label(f)).collect();
            let stacks = if r.holder {
                &mut self.holders
            } else {
                &mut self.waiters
            };
            let e = stacks.entry(labels).or_default();
            e.0 += r.count;
            e.1 += r.wait_ns_sum;
            let cause = r.cause.to_string();
            if let Some(js) = frames.iter().find(|f| application_js(f)) {
                let file = location(js, js.script.as_deref().unwrap_or_default());
                let e = if r.holder {
                    (self.holder_js)
                        .entry((js.function.clone(), file, cause.clone()))
                        .or_default()
                } else {
                    self.js.entry((js.function.clone(), file)).or_default()
                };
                e.0 += r.count;
                e.1 += r.wait_ns_sum;
            }
            if let Some(f) = charged(&frames) {
                let by = if r.holder {
                    &mut self.holding
                } else {
                    &mut self.waiting
                };
                let e = by.entry((label(f), cause)).or_default();
                e.0 += r.count;
                e.1 += r.wait_ns_sum;
            }
        }
    }

    /// The functions that waited (`holders` false) or held (true) longest, most wait first.
    pub fn functions(&self, holders: bool) -> Vec<TriggerFunction> {
        let by = if holders {
            &self.holding
        } else {
            &self.waiting
        };
        let mut v: Vec<TriggerFunction> = (by.iter())
            .map(|((function, cause), &(waits, wait_ns))| TriggerFunction {
                function: function.clone(),
                cause: cause.clone(),
                waits,
                wait_ns,
            })
            .collect();
        v.sort_by(|a, b| (b.wait_ns, b.waits, &a.function).cmp(&(a.wait_ns, a.waits, &b.function)));
        v.truncate(TOP);
        v
    }

    /// Puts the stacks into `p` as a summary has them, for the findings.
    pub fn fill(&self, p: &mut ProcessReport) {
        let top = |m: &HashMap<Vec<String>, (u64, u64)>| {
            let mut v: Vec<StackReport> = (m.iter())
                .map(|(frames, &(count, wait_ns_sum))| StackReport {
                    frames: frames.clone(),
                    count,
                    wait_ns_sum,
                })
                .collect();
            v.sort_by(|a, b| {
                (b.wait_ns_sum, b.count, &a.frames).cmp(&(a.wait_ns_sum, a.count, &b.frames))
            });
            v.truncate(TOP);
            v
        };
        p.stacks = Some(top(&self.waiters));
        let mut flame: Vec<FlameStack> = (self.waiters.iter())
            .map(|(frames, &(count, _))| FlameStack {
                stack: (frames.iter().rev())
                    .map(|f| f.replace(';', ":"))
                    .collect::<Vec<_>>()
                    .join(";"),
                count,
            })
            .collect();
        flame.sort_by(|a, b| (b.count, &a.stack).cmp(&(a.count, &b.stack)));
        p.flame = Some(flame);
        let mut js: Vec<JsFunctionReport> = (self.js.iter())
            .map(
                |((function, file), &(writes, wait_ns_sum))| JsFunctionReport {
                    function: function.clone(),
                    file: file.clone(),
                    writes,
                    wait_ns_sum,
                },
            )
            .collect();
        js.sort_by(|a, b| {
            (b.writes, b.wait_ns_sum, &a.function).cmp(&(a.writes, a.wait_ns_sum, &b.function))
        });
        p.js_functions = Some(js);
        if !self.holders.is_empty() {
            p.holder_stacks = Some(top(&self.holders));
            let mut hf: Vec<HolderFunctionReport> = (self.holder_js.iter())
                .map(
                    |((function, file, cause), &(waits, wait_ns_sum))| HolderFunctionReport {
                        function: function.clone(),
                        file: file.clone(),
                        cause: cause.clone().into(),
                        waits,
                        wait_ns_sum,
                    },
                )
                .collect();
            hf.sort_by(|a, b| {
                (b.wait_ns_sum, b.waits, &a.function).cmp(&(a.wait_ns_sum, a.waits, &b.function))
            });
            p.holder_functions = Some(hf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn js(name: &str, script: &str) -> FrameReport {
        FrameReport {
            function: name.into(),
            script: Some(script.into()),
            line: Some(3),
            column: Some(9),
            ..FrameReport::default()
        }
    }

    fn native(name: &str, dso: &str) -> FrameReport {
        FrameReport {
            function: name.into(),
            dso: Some(dso.into()),
            ..FrameReport::default()
        }
    }

    #[test]
    fn a_sample_is_charged_to_the_applications_innermost_function() {
        let munmap = native("munmap", "/usr/lib/x86_64-linux-gnu/libc.so.6");
        let free = native("v8::base::OS::Free", "/usr/bin/node");
        let internal = js("readFileSync", "node:fs");
        let app = js("readChunks", "/srv/app/phases.js");
        assert_eq!(
            charged(&[&munmap, &internal, &app]).map(label).unwrap(),
            "readChunks (/srv/app/phases.js:3:9)"
        );
        assert_eq!(
            charged(&[&munmap, &free]).map(label).unwrap(),
            "v8::base::OS::Free (node)"
        );
        assert_eq!(
            charged(&[&munmap]).map(label).unwrap(),
            "munmap (libc.so.6)"
        );
        assert!(charged(&[]).is_none());
    }
}
