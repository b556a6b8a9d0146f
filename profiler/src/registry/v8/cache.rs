//! A SharedFunctionInfo's name and definition, and a Script's name and line ends, read once
//! and cached by address: objects move and die, so each hit is checked against the two fields
//! it was read from (another object at the same address has other fields).

use std::{collections::HashMap, sync::Arc};

use super::{V8Process, heap::is_heap_object, memory::Memory, names::line_column};
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

/// What a read of heap objects gave: done (cached), or not possible now (not cached).
enum Read<T> {
    Done(T),
    Unreadable,
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
        let at_sample = (self.at_sample.get(&sfi))
            .filter(|n| n.fields == (nosi, script))
            .cloned();
        let read = match at_sample {
            Some(n) => self.function_at_sample(n),
            None => self.read_function(sfi, script),
        };
        match read {
            Read::Done(function) => {
                if function.is_some() {
                    self.newly_named.push(sfi);
                }
                self.sfis.insert(sfi, (nosi, script), function.clone());
                function
            }
            Read::Unreadable => None,
        }
    }

    /// The SharedFunctionInfos (tagged) named since the last call: the kernel side need not
    /// copy their names again (`Kernel::note_v8_named`).
    pub fn take_named(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.newly_named)
    }

    /// The function's name and location; [`Read::Unreadable`] when its Script cannot be read
    /// now (not cached: read again at its next frame). A function whose Script's objects were
    /// readable when its own fields were, and are not now, is most likely in an isolate being
    /// torn down: its name is not trusted either.
    fn read_function(&mut self, sfi: u64, script: u64) -> Read<Option<JsFunction>> {
        let Some((name, start)) = self.heap().sfi_name(sfi) else {
            return Read::Done(None);
        };
        let name = if name.is_empty() {
            "(anonymous)".to_string()
        } else {
            name
        };
        let location = match self.script(script) {
            Read::Done(resolved) => self.location(resolved, start),
            Read::Unreadable => return Read::Unreadable,
        };
        Read::Done(Some(JsFunction { name, location }))
    }

    /// The function named from one sample's copies (`checks::named_at_sample`): its Script's
    /// line ends from the cache if that Script (by address and fields, as copied) is there,
    /// else read now, if the Script now at its address holds the fields the copy held (the
    /// same Script), else not now.
    fn function_at_sample(&mut self, n: super::NamedAtSample) -> Read<Option<JsFunction>> {
        let name = if n.name.is_empty() {
            "(anonymous)".to_string()
        } else {
            n.name
        };
        let resolved = match n.script {
            None => None,
            Some((fields, script_name)) => {
                let script = n.fields.1;
                match self.scripts.get(script, fields) {
                    Some(r) => Some(r),
                    // Node's own module, whose source (static data of node's binary, where the
                    // copy says it lies) has had its line ends read: nothing read now.
                    None if let Some(r) = self.builtin_at_sample(&script_name, n.builtin) => {
                        self.scripts.insert(script, fields, r.clone());
                        Some(r)
                    }
                    None => match self.script_expecting(script, Some((fields, script_name))) {
                        Read::Done(r) => r,
                        Read::Unreadable => return Read::Unreadable,
                    },
                }
            }
        };
        Read::Done(Some(JsFunction {
            name,
            location: self.location(resolved, n.start),
        }))
    }

    /// The name and line ends of node's own module named `name` whose source lies at
    /// `builtin` (as `Heap::external_source` gives it), if those line ends have been read.
    fn builtin_at_sample(
        &self,
        name: &Option<String>,
        builtin: Option<(u64, usize, bool)>,
    ) -> Option<(String, Arc<Vec<i32>>)> {
        let name = name.as_ref().filter(|n| n.starts_with("node:"))?;
        let (at, len, one_byte) = builtin?;
        let (binary, shared) = &self.builtin_sources;
        let ends = shared
            .ends
            .borrow()
            .get(&(binary.clone(), at, len, one_byte))
            .cloned()?;
        Some((name.clone(), ends))
    }

    /// `name script:line:column` as V8 writes it in its perf map.
    fn location(&self, script: Option<(String, Arc<Vec<i32>>)>, start: Option<i32>) -> String {
        let Some((script_name, ends)) = script else {
            return String::new();
        };
        match start.and_then(|p| line_column(&ends, p)) {
            // As V8 writes it in its perf map: no column before V8 11.
            Some((line, _)) if self.layout.version < (11, 0, 0) => format!("{script_name}:{line}"),
            Some((line, column)) => format!("{script_name}:{line}:{column}"),
            None => script_name,
        }
    }

    /// A script's name and line ends, cached and checked on each use: `Done(None)` when the
    /// field holds no Script (a builtin's), [`Read::Unreadable`] when it does (or its type
    /// cannot be read) and the Script cannot be read now (not cached).
    fn script(&mut self, script: u64) -> Read<Option<(String, Arc<Vec<i32>>)>> {
        self.script_expecting(script, None)
    }

    /// [`script`](Self::script), for a Script that must hold the fields `expect` holds (and
    /// whose name, if given, is the one read at the same time as they were).
    fn script_expecting(
        &mut self,
        script: u64,
        expect: Option<((u64, u64), Option<String>)>,
    ) -> Read<Option<(String, Arc<Vec<i32>>)>> {
        let l = Arc::clone(&self.layout);
        let fields = {
            let h = self.heap();
            if !is_heap_object(script) {
                return Read::Done(None);
            }
            match h.instance_type(script) {
                None => return Read::Unreadable,
                Some(t) if t != l.script_type => return Read::Done(None),
                Some(_) => {}
            }
            h.field(script, l.script_name)
                .zip(h.field(script, l.script_source))
        };
        let Some(fields) = fields else {
            return Read::Unreadable;
        };
        let known_name = match expect {
            Some((f, _)) if f != fields => return Read::Unreadable,
            Some((_, name)) => name,
            None => None,
        };
        if let Some(resolved) = self.scripts.get(script, fields) {
            return Read::Done(Some(resolved));
        }
        match self.read_script(script, known_name) {
            Some(resolved) => {
                self.scripts.insert(script, fields, resolved.clone());
                Read::Done(Some(resolved))
            }
            None => Read::Unreadable,
        }
    }

    /// A script's name and line ends (None if its name cannot be read). Node's own modules
    /// (`node:...`) keep their sources in node's binary, as external strings of static data: the
    /// same bytes at the same address in every isolate of the process (each Worker has its own
    /// Script objects), so their line ends are read once per process, by that address and length
    /// (once per binary when its processes share them: `SharedSources`).
    fn read_script(
        &mut self,
        script: u64,
        known_name: Option<String>,
    ) -> Option<(String, Arc<Vec<i32>>)> {
        let (name, builtin) = {
            let h = self.heap();
            let name = match known_name {
                Some(n) => n,
                None => h.script_name(script)?,
            };
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
        // Line ends that cannot be read (a source in a representation not read here) leave
        // the script's name alone as the location.
        let Some(key) = key else {
            let ends = self.script_ends(script, &name);
            return Some((name, ends));
        };
        let ends = Arc::new(self.heap().read_line_ends(script).unwrap_or_default());
        if !ends.is_empty() {
            let mut cached = self.builtin_sources.1.ends.borrow_mut();
            if cached.len() >= MAX_CACHED {
                cached.clear();
            }
            cached.insert(key, Arc::clone(&ends));
        }
        Some((name, ends))
    }
}
