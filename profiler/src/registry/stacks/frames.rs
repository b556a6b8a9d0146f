//! A sampled frame as the report names it, kept in parts (function, script and line, the file
//! mapped and its build id) so that a profile format can place each part where it belongs
//! (pprof's functions, lines and mappings), and interned per process: a process's distinct
//! stacks share most of their frames.

use std::collections::HashMap;

use crate::registry::{perfmap::JsFunction, unwind::Frame, v8::Resolved};

use super::labels::js_of;

/// One frame of a sampled stack, named.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampledFrame {
    /// The function: a native symbol, a JavaScript function, V8's name for other generated
    /// code, `[js unknown]`, `[jit]`, or the address (`0x…`) in a file without a symbol for
    /// it.
    pub function: String,
    /// A JavaScript function's script (its definition), as V8 names it.
    pub script: Option<String>,
    /// Where in the script the function is defined (V8's line and column, from 1).
    pub line: Option<u32>,
    pub column: Option<u32>,
    /// The file whose code it is, as the process mapped it (native frames).
    pub dso: Option<String>,
    /// That file's GNU build id, in hex, when it has one and its unwind tables were read.
    pub build_id: Option<String>,
}

/// `script:line:column` (or `script:line`, or the script alone) split where V8 joined it;
/// parts that would not print back the same are left in the script.
fn split_location(location: &str) -> (String, Option<u32>, Option<u32>) {
    let number = |s: &str| s.parse::<u32>().ok().filter(|n| n.to_string() == s);
    let mut parts = location.rsplitn(3, ':');
    let (last, middle, rest) = (parts.next(), parts.next(), parts.next());
    match (last.and_then(number), middle, rest) {
        (Some(c), Some(m), Some(script)) if number(m).is_some() && !script.is_empty() => {
            (script.to_string(), number(m), Some(c))
        }
        (Some(l), Some(_), _) => {
            let (script, _) = location.rsplit_once(':').expect("two parts");
            (script.to_string(), Some(l), None)
        }
        _ => (location.to_string(), None, None),
    }
}

impl SampledFrame {
    /// A symbolized frame's parts; `build_id` is that of the file its code is in.
    pub fn of(f: &Frame) -> SampledFrame {
        let named = |function: String| SampledFrame {
            function,
            script: None,
            line: None,
            column: None,
            dso: None,
            build_id: None,
        };
        match (js_of(f), &f.jit) {
            (Some(js), _) => return Self::js(js),
            (None, Some(crate::registry::perfmap::JitName::Other(n))) => return named(n.clone()),
            _ => {}
        }
        if f.v8 == Some(Resolved::Unknown) {
            return named("[js unknown]".to_string());
        }
        let Some(dso) = &f.dso else {
            return named(f.symbol.clone().unwrap_or_else(|| "[jit]".to_string()));
        };
        SampledFrame {
            dso: Some(dso.display().to_string()),
            build_id: f.build_id.clone(),
            ..named(f.symbol.clone().unwrap_or_else(|| format!("{:#x}", f.addr)))
        }
    }

    /// A JavaScript function: its name, and its definition split into script, line and column.
    fn js(js: &JsFunction) -> SampledFrame {
        let (script, line, column) = if js.location.is_empty() {
            (None, None, None)
        } else {
            let (s, l, c) = split_location(&js.location);
            (Some(s), l, c)
        };
        SampledFrame {
            function: js.name.clone(),
            script,
            line,
            column,
            dso: None,
            build_id: None,
        }
    }

    /// How the report shows it: `function (file)` for native code (the file's name alone),
    /// `name (script:line:column)` for a JavaScript function, the name alone otherwise.
    pub fn label(&self) -> String {
        label_parts(
            &self.function,
            self.script.as_deref(),
            [self.line, self.column],
            self.dso.as_deref(),
        )
    }
}

/// A process's frames, each kept once; stacks refer to them by index.
#[derive(Clone, Debug, Default)]
pub struct FrameTable {
    frames: Vec<SampledFrame>,
    index: HashMap<SampledFrame, u32>,
}

impl FrameTable {
    /// The index of `f`, added if new.
    pub fn intern(&mut self, f: SampledFrame) -> u32 {
        if let Some(&i) = self.index.get(&f) {
            return i;
        }
        let i = self.frames.len() as u32;
        self.frames.push(f.clone());
        self.index.insert(f, i);
        i
    }

    pub fn get(&self, i: u32) -> &SampledFrame {
        &self.frames[i as usize]
    }
}

/// A frame as reports show it: `name (script:line:column)` for a JavaScript function,
/// `function (file)` for native code (the file's name alone), the name alone otherwise.
pub fn label_parts(
    function: &str,
    script: Option<&str>,
    [line, column]: [Option<u32>; 2],
    dso: Option<&str>,
) -> String {
    if let Some(script) = script {
        let mut at = script.to_string();
        for n in [line, column].into_iter().flatten() {
            at = format!("{at}:{n}");
        }
        return format!("{function} ({at})");
    }
    match dso {
        Some(dso) => {
            let file = std::path::Path::new(dso)
                .file_name()
                .map_or(dso.to_string(), |n| n.to_string_lossy().into_owned());
            format!("{function} ({file})")
        }
        None => function.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definition_splits_where_v8_joined_it_and_prints_back_the_same() {
        for (loc, want) in [
            ("/srv/app.js:12:3", ("/srv/app.js", Some(12), Some(3))),
            (
                "file:///srv/a.mjs:4:1",
                ("file:///srv/a.mjs", Some(4), Some(1)),
            ),
            ("/srv/app.js:12", ("/srv/app.js", Some(12), None)),
            ("node:buffer:7:9", ("node:buffer", Some(7), Some(9))),
            (
                "evalmachine.<anonymous>",
                ("evalmachine.<anonymous>", None, None),
            ),
            ("a:x:12", ("a:x", Some(12), None)),
            ("a:012:5", ("a:012", Some(5), None)),
        ] {
            let (s, l, c) = split_location(loc);
            assert_eq!((s.as_str(), l, c), want, "{loc}");
            let js = JsFunction {
                name: "f".into(),
                location: loc.into(),
            };
            assert_eq!(SampledFrame::js(&js).label(), format!("f ({loc})"));
        }
    }
}
