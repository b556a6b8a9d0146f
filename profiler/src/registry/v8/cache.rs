//! A SharedFunctionInfo's name and definition, and a Script's name and line ends, read once
//! and cached by address: objects move and die, so each hit is checked against the two fields
//! it was read from (another object at the same address has other fields).

use std::{collections::HashMap, sync::Arc};

use super::{V8Process, memory::Memory, names::line_column};
use crate::registry::perfmap::JsFunction;

/// Most SharedFunctionInfos and Scripts cached per process (a process that compiles without
/// end gets its cache emptied and rebuilt rather than growing it).
const MAX_CACHED: usize = 65_536;

/// What was read of heap objects (SharedFunctionInfos, Scripts) by address, each with the two
/// fields it was read from: an entry is used only while they are unchanged (the object may
/// have been moved or replaced since). Emptied rather than grown past [`MAX_CACHED`].
pub(super) struct Checked<V> {
    entries: HashMap<u64, ((u64, u64), V)>,
}

impl<V: Clone> Checked<V> {
    pub(super) fn new() -> Self {
        Checked {
            entries: HashMap::new(),
        }
    }

    fn get(&self, addr: u64, fields: (u64, u64)) -> Option<V> {
        self.entries
            .get(&addr)
            .filter(|(f, _)| *f == fields)
            .map(|(_, v)| v.clone())
    }

    fn insert(&mut self, addr: u64, fields: (u64, u64), v: V) {
        if self.entries.len() >= MAX_CACHED {
            self.entries.clear();
        }
        self.entries.insert(addr, (fields, v));
    }
}

impl<M: Memory> V8Process<M> {
    /// The name and definition of a JSFunction (checked by type only: for tests, with a
    /// function known to be alive).
    #[cfg(test)]
    pub fn function_name(&mut self, f: u64) -> Option<JsFunction> {
        let sfi = {
            let h = self.heap();
            let l = &*self.layout;
            let ty = h.instance_type(f)?;
            if !(l.js_function_first..=l.js_function_last).contains(&ty) {
                return None;
            }
            h.typed(h.field(f, l.js_function_shared)?, l.sfi_type)?
        };
        self.sfi_function(sfi)
    }

    /// Whether the name of the SharedFunctionInfo `sfi` (tagged) holding `fields` (its name
    /// or scope info, and script) is cached.
    pub(super) fn sfi_cached(&self, sfi: u64, fields: (u64, u64)) -> bool {
        self.sfis.get(sfi, fields).is_some()
    }

    /// The name and definition of a SharedFunctionInfo, cached and checked on each use.
    pub(super) fn sfi_function(&mut self, sfi: u64) -> Option<JsFunction> {
        let l = Arc::clone(&self.layout);
        let (nosi, script) = {
            let h = self.heap();
            (
                h.field(sfi, l.sfi_name_or_scope_info)?,
                h.field(sfi, l.sfi_script)?,
            )
        };
        if let Some(function) = self.sfis.get(sfi, (nosi, script)) {
            return function;
        }
        let function = self.read_function(sfi, script);
        self.sfis.insert(sfi, (nosi, script), function.clone());
        function
    }

    fn read_function(&mut self, sfi: u64, script: u64) -> Option<JsFunction> {
        let (name, start) = self.heap().sfi_name(sfi)?;
        let name = if name.is_empty() {
            "(anonymous)".to_string()
        } else {
            name
        };
        let location = match self.script(script) {
            Some((script_name, ends)) => match start.and_then(|p| line_column(&ends, p)) {
                // As V8 writes it in its perf map: no column before V8 11.
                Some((line, _)) if self.layout.version < (11, 0, 0) => {
                    format!("{script_name}:{line}")
                }
                Some((line, column)) => format!("{script_name}:{line}:{column}"),
                None => script_name,
            },
            None => String::new(),
        };
        Some(JsFunction { name, location })
    }

    /// A script's name and line ends, cached and checked on each use.
    fn script(&mut self, script: u64) -> Option<(String, Arc<Vec<i32>>)> {
        let l = Arc::clone(&self.layout);
        let (name, source) = {
            let h = self.heap();
            h.typed(script, l.script_type)?;
            (
                h.field(script, l.script_name)?,
                h.field(script, l.script_source)?,
            )
        };
        if let Some(resolved) = self.scripts.get(script, (name, source)) {
            return resolved;
        }
        let resolved = self.read_script(script);
        self.scripts
            .insert(script, (name, source), resolved.clone());
        resolved
    }

    /// A script's name and line ends. Node's own modules (`node:...`) keep their sources in
    /// node's binary, as external strings of static data: the same bytes at the same address
    /// in every isolate of the process (each Worker has its own Script objects), so their
    /// line ends are read once per process, by that address and length (once per binary
    /// when its processes share them: `SharedSources`).
    fn read_script(&mut self, script: u64) -> Option<(String, Arc<Vec<i32>>)> {
        let (name, builtin) = {
            let h = self.heap();
            let name = h.script_name(script)?;
            let builtin = name
                .starts_with("node:")
                .then(|| h.external_source(script))
                .flatten();
            (name, builtin)
        };
        let (binary, shared) = &self.builtin_sources;
        let key = builtin.map(|(at, len, one_byte)| (binary.clone(), at, len, one_byte));
        if let Some(key) = &key
            && let Some(ends) = shared.ends.borrow().get(key)
        {
            return Some((name, Arc::clone(ends)));
        }
        let ends = Arc::new(self.heap().script_line_ends(script)?);
        if let Some(key) = key {
            let mut cached = self.builtin_sources.1.ends.borrow_mut();
            if cached.len() >= MAX_CACHED {
                cached.clear();
            }
            cached.insert(key, Arc::clone(&ends));
        }
        Some((name, ends))
    }
}
