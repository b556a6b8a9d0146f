//! The names of threads' start routines, by file and offset: every Worker of every node
//! process starts in the same few functions of one binary, and symbolizing each (blazesym's
//! lookup and its C++ demangling, when its role is decided) was a few percent of the agent's
//! CPU on a host starting node processes.

use std::{cell::RefCell, collections::HashMap, path::Path};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};

/// A file as mapped: its device and inode (what a process maps is the same file as another
/// process's mapping with both equal).
pub type FileId = (String, u64);

/// Most names kept (a host's start routines are a few dozen; emptied past it).
const MAX_NAMES: usize = 4096;

/// The symbolizer of start routines, and the names it gave, by file and offset.
#[derive(Default)]
pub struct StartNames {
    symbolizer: Symbolizer,
    names: RefCell<HashMap<(FileId, u64), String>>,
}

impl StartNames {
    /// The function at `offset` of `file`, opened at `readable` (shown as `mapped` when it
    /// has no symbol there); from the names given before when the same file was named there.
    pub fn name(&self, file: &FileId, readable: &Path, mapped: &Path, offset: u64) -> String {
        let key = (file.clone(), offset);
        if let Some(n) = self.names.borrow().get(&key) {
            return n.clone();
        }
        let src = Source::Elf(Elf::new(readable));
        let name = match self
            .symbolizer
            .symbolize_single(&src, Input::FileOffset(offset))
        {
            Ok(Symbolized::Sym(sym)) => sym.name.to_string(),
            other => {
                log::debug!("{}+{offset:#x}: {other:?}", mapped.display());
                format!("{}+{offset:#x}", mapped.display())
            }
        };
        let mut names = self.names.borrow_mut();
        if names.len() >= MAX_NAMES {
            names.clear();
        }
        names.insert(key, name.clone());
        name
    }
}
