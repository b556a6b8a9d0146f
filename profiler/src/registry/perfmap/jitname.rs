//! V8's names for its code objects, as its perf map writes them (`JS:*hotAllocator
//! /srv/app.js:12:3`), parsed into a JavaScript function or other generated code. The heap
//! reader (`v8`) names functions in the same terms, so that both sources name a function alike.

/// A JavaScript function as V8 names its code: `JS:*hotAllocator /srv/app.js:12:3`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JsFunction {
    pub name: String,
    /// `file:line:column`, as V8 writes it (empty for code with no script).
    pub location: String,
}

/// What a perf map says about an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JitName {
    /// JavaScript code (any tier: interpreted `~`, Sparkplug `^`, Maglev `+`, TurboFan `*`;
    /// Node 24 and later mark context-specialized code with `'` after the tier, Node 26
    /// on-stack replacement code with `o` before it, e.g. `JS:o*'loop`).
    Js(JsFunction),
    /// Other generated code: a builtin, a bytecode handler, a regular expression, a stub.
    Other(String),
}

impl JitName {
    /// V8's name for a code object, split into its kind and function.
    pub fn parse(raw: &str) -> JitName {
        let raw = raw.trim();
        // V8 10 and older tag functions by how they were compiled, and write no column.
        let tags = ["JS:", "LazyCompile:", "Function:", "Script:", "Eval:"];
        let Some(rest) = tags.iter().find_map(|t| raw.strip_prefix(t)) else {
            return JitName::Other(raw.to_string());
        };
        // The tier marker, if any (`o` only before one: it may begin a name).
        let tiers = ['~', '^', '*', '+'];
        let rest = rest
            .strip_prefix('o')
            .filter(|r| r.starts_with(tiers))
            .unwrap_or(rest);
        let rest = match rest.strip_prefix(tiers) {
            Some(r) => r.strip_prefix('\'').unwrap_or(r),
            None => rest,
        };
        let (name, location) = match rest.rsplit_once(' ') {
            Some((n, l)) => (n.trim(), l.trim()),
            None => (rest.trim(), ""),
        };
        let name = if name.is_empty() { "(anonymous)" } else { name };
        JitName::Js(JsFunction {
            name: name.to_string(),
            location: location.to_string(),
        })
    }
}
