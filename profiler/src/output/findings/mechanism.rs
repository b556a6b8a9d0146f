//! What a sampled write stack shows the lock was taken for: the mechanism behind a write
//! (a thread's stack mapped by `pthread_create`, a block above malloc's mmap threshold, an
//! arena growing, V8's heap, WebAssembly memory, a shared object loaded, or the code's own
//! mappings), read from the C runtime's frames nearest the system call and the code that
//! called them (docs/findings.md, "Mechanisms").

use crate::output::report::FrameReport;

/// Why a write took the lock, as its stack shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mechanism {
    /// `pthread_create` mapping a new thread's stack and protecting its guard page; the
    /// join or exit path unmapping stacks glibc does not keep.
    Threads,
    /// malloc serving a block at or above its mmap threshold with an mmap of its own, free
    /// unmapping it.
    LargeAlloc,
    /// glibc's arenas growing and shrinking: a thread arena's heap made usable or given back
    /// (mprotect, a new heap mapped, an empty one unmapped), the main arena's `brk`.
    Arena,
    /// V8 mapping, protecting and unmapping the pages of its heap and code space.
    V8Heap,
    /// WebAssembly memory growing.
    Wasm,
    /// Shared objects mapped from their files (`dlopen`: an addon `require`d, a library).
    FileMap,
    /// The code's own calls, of no mechanism above (an addon's `mmap`).
    Own,
    /// Through C runtime code that could not be named (glibc without its debug symbols:
    /// its internals are bare addresses): no mechanism can be told, and no finding is made
    /// of it, but its share of the writes is kept apart rather than given to the others.
    Unnamed,
}

impl Mechanism {
    /// What it is, in a few words.
    pub fn what(self) -> &'static str {
        match self {
            Mechanism::Threads => "thread creation and exit (stacks and guard pages)",
            Mechanism::LargeAlloc => "large allocations above malloc's mmap threshold",
            Mechanism::Arena => "glibc's malloc arenas growing and shrinking",
            Mechanism::V8Heap => "V8's heap and code space",
            Mechanism::Wasm => "WebAssembly memory growing",
            Mechanism::FileMap => "shared objects mapped from their files",
            Mechanism::Own => "the code's own mappings",
            Mechanism::Unnamed => "C runtime code not named",
        }
    }
}

/// The file name of a frame's mapped file (`/usr/lib/x86_64-linux-gnu/libc.so.6` ->
/// `libc.so.6`).
fn file_name(f: &FrameReport) -> &str {
    let dso = f.dso.as_deref().unwrap_or("");
    dso.rsplit('/').next().unwrap_or(dso)
}

/// The C and C++ runtimes, which map memory on behalf of the code that called them.
pub fn in_runtime(f: &FrameReport) -> bool {
    let name = file_name(f);
    [
        "libc.so",
        "libc-",
        "ld-linux",
        "libstdc++",
        "libgcc_s",
        "libpthread",
        "libjemalloc",
        "libtcmalloc",
        "libmimalloc",
    ]
    .iter()
    .any(|r| name.starts_with(r))
}

/// A symbol as compared here: no leading underscores, no version (`@@GLIBC_2.34`), no
/// compiler suffix (`.isra.0`, `.constprop.0`, `.part.0`).
fn bare(function: &str) -> &str {
    let f = function.trim_start_matches('_');
    let f = f.split('@').next().unwrap_or(f);
    match f.find('.') {
        Some(i) if i > 0 => &f[..i],
        _ => f,
    }
}

/// glibc's thread creation, join and exit (exported entry points, and with its debug
/// symbols the internals between them and the system call).
const THREADS: &[&str] = &[
    "pthread_create",
    "pthread_create_2_1",
    "allocate_stack",
    "create_thread",
    "pthread_join",
    "pthread_clockjoin_ex",
    "pthread_timedjoin_ex",
    "pthread_timedjoin_np",
    "pthread_tryjoin_np",
    "pthread_detach",
    "pthread_exit",
    "free_tcb",
    "nptl_free_tcb",
    "nptl_deallocate_stack",
    "nptl_free_stacks",
    "free_stacks",
    "queue_stack",
    "nptl_stack_list_del",
    "thrd_create",
    "thrd_join",
];

/// glibc's arena internals (with its debug symbols) and the main arena's `brk`.
const ARENA: &[&str] = &[
    "grow_heap",
    "new_heap",
    "alloc_new_heap",
    "shrink_heap",
    "delete_heap",
    "heap_trim",
    "int_new_arena",
    "arena_get2",
    "systrim",
    "sbrk",
    "brk",
    "default_morecore",
    "morecore",
];

/// glibc's large-chunk paths (with its debug symbols).
const LARGE: &[&str] = &[
    "sysmalloc_mmap",
    "sysmalloc_mmap_fallback",
    "mmap_chunk",
    "munmap_chunk",
    "mremap_chunk",
];

/// The allocator's entry points (glibc's, jemalloc's and the C++ runtime's).
const MALLOC: &[&str] = &[
    "malloc",
    "libc_malloc",
    "calloc",
    "libc_calloc",
    "realloc",
    "libc_realloc",
    "free",
    "libc_free",
    "cfree",
    "posix_memalign",
    "libc_memalign",
    "memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "int_malloc",
    "int_free",
    "int_memalign",
    "int_realloc",
    "sysmalloc",
    "libc_pvalloc",
    "libc_valloc",
    "je_malloc",
    "je_free",
    "mallocx",
    "sdallocx",
    "tc_malloc",
    "tc_free",
];

/// The dynamic loader mapping a shared object.
const LOADER: &[&str] = &[
    "dlopen",
    "dlopen_implementation",
    "libc_dlopen_mode",
    "dl_open",
    "dl_open_worker",
    "dl_open_worker_begin",
    "dl_map_object",
    "dl_map_object_from_fd",
    "dl_map_segments",
    "dl_map_segment",
    "uv_dlopen",
];

fn any_of(frames: &[&FrameReport], names: &[&str]) -> bool {
    frames.iter().any(|f| names.contains(&bare(&f.function)))
}

/// A C++ operator new or delete (`operator new(unsigned long)`), which calls malloc or free.
fn is_operator(f: &FrameReport) -> bool {
    f.function.starts_with("operator new") || f.function.starts_with("operator delete")
}

/// The mechanism of one sampled write stack (`frames` innermost first) of write cause
/// `cause`. The C runtime's frames nearest the system call say most; the code above them
/// says the rest (V8's page allocator, WebAssembly, the loader). `None` for the causes no
/// mechanism here explains (`fork`, `exit`, a stack's growth, reads).
pub fn classify(frames: &[&FrameReport], cause: &str) -> Option<Mechanism> {
    if !matches!(
        cause,
        "mmap" | "munmap" | "mprotect" | "brk" | "mremap" | "madvise"
    ) {
        return None;
    }
    let runtime_len = frames.iter().take_while(|f| in_runtime(f)).count();
    let runtime = &frames[..runtime_len];
    let code = &frames[runtime_len..];
    // The loader first: it maps files with mmap and protects their segments with mprotect,
    // and calls malloc as it goes.
    if any_of(runtime, LOADER)
        || code
            .iter()
            .take(4)
            .any(|f| LOADER.contains(&bare(&f.function)))
    {
        return Some(Mechanism::FileMap);
    }
    if any_of(runtime, THREADS) {
        return Some(Mechanism::Threads);
    }
    if any_of(runtime, LARGE) {
        return Some(Mechanism::LargeAlloc);
    }
    if any_of(runtime, ARENA) {
        return Some(Mechanism::Arena);
    }
    let wasm = |f: &&&FrameReport| {
        let name = f.function.to_ascii_lowercase();
        name.contains("wasm") && f.script.is_none()
    };
    if code.iter().take(24).any(|f| wasm(&f)) {
        return Some(Mechanism::Wasm);
    }
    let malloc = any_of(runtime, MALLOC) || runtime.iter().any(|f| is_operator(f));
    if malloc {
        // Without glibc's debug symbols its internals are bare addresses: the cause tells.
        return Some(match cause {
            "mprotect" | "brk" => Mechanism::Arena,
            _ => Mechanism::LargeAlloc,
        });
    }
    // The first frame of the code: V8's page allocator and heap map their own pages.
    if code.first().is_some_and(|f| {
        let n = f.function.as_str();
        f.script.is_none()
            && (n.starts_with("v8::")
                || n.starts_with("cppgc::")
                || n.starts_with("heap::base::")
                || n.starts_with("partition_alloc::"))
    }) {
        return Some(Mechanism::V8Heap);
    }
    if cause == "brk" {
        return Some(Mechanism::Arena);
    }
    // Unnamed frames of the runtime between the system call's wrapper and the code: glibc's
    // internals (the join path's free_stacks, say) without its debug symbols.
    if runtime.iter().skip(1).any(|f| f.function.starts_with("0x")) {
        return Some(Mechanism::Unnamed);
    }
    Some(Mechanism::Own)
}

/// The code a mechanism's write is charged to: the first frame outside the C runtime (and
/// outside V8's page allocator, for V8's heap), `function (file)` shortened.
pub fn code_frame<'a>(frames: &[&'a FrameReport], m: Mechanism) -> Option<&'a FrameReport> {
    let mut code = frames.iter().skip_while(|f| in_runtime(f));
    match m {
        Mechanism::V8Heap => code
            .clone()
            .find(|f| {
                let n = f.function.as_str();
                !(n.starts_with("v8::base::")
                    || n.contains("PageAllocator")
                    || n.contains("VirtualMemory")
                    || n.starts_with("v8::internal::MemoryAllocator")
                    || n.starts_with("partition_alloc::"))
            })
            .or_else(|| code.next())
            .copied(),
        _ => code.next().copied(),
    }
}

/// A frame as a finding names it: a JavaScript function with its definition, native code as
/// `function (file)`, without template arguments and parameters.
pub fn frame_text(f: &FrameReport) -> String {
    if let Some(script) = &f.script {
        return match (f.line, f.column) {
            (Some(l), Some(c)) => format!("{} ({script}:{l}:{c})", f.function),
            (Some(l), None) => format!("{} ({script}:{l})", f.function),
            _ => format!("{} ({script})", f.function),
        };
    }
    let label = match &f.dso {
        Some(_) => format!("{} ({})", f.function, file_name(f)),
        None => f.function.clone(),
    };
    super::evidence::short(&label)
}

/// The innermost JavaScript function of the application on a stack (node's own `node:`
/// modules passed over when an application function is below them), as a finding names it.
pub fn js_frame(frames: &[&FrameReport]) -> Option<String> {
    let js: Vec<&&FrameReport> = frames.iter().filter(|f| f.script.is_some()).collect();
    js.iter()
        .find(|f| !f.script.as_deref().unwrap_or("").starts_with("node:"))
        .or(js.first())
        .map(|f| frame_text(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn native(function: &str, dso: &str) -> FrameReport {
        FrameReport {
            function: function.into(),
            dso: Some(dso.into()),
            ..FrameReport::default()
        }
    }

    const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

    fn of(frames: &[FrameReport], cause: &str) -> Option<Mechanism> {
        let refs: Vec<&FrameReport> = frames.iter().collect();
        classify(&refs, cause)
    }

    #[test]
    fn thread_stacks_are_told_with_or_without_glibcs_debug_symbols() {
        let addon = native("hash_lanes", "/srv/node_modules/lanes.node");
        // With libc6-dbg: every frame named.
        let named = [
            native("__mmap", LIBC),
            native("allocate_stack", LIBC),
            native("pthread_create@@GLIBC_2.34", LIBC),
            addon.clone(),
        ];
        assert_eq!(of(&named, "mmap"), Some(Mechanism::Threads));
        // Without: glibc's internals are bare addresses, its entry points still named.
        let bare_addrs = [
            native("__mprotect", LIBC),
            native("0x7f3a0c08f1a2", LIBC),
            native("pthread_create", LIBC),
            addon.clone(),
        ];
        assert_eq!(of(&bare_addrs, "mprotect"), Some(Mechanism::Threads));
        let join = [
            native("munmap", LIBC),
            native("0x7f3a0c08e000", LIBC),
            native("__pthread_clockjoin_ex", LIBC),
            addon.clone(),
        ];
        assert_eq!(of(&join, "munmap"), Some(Mechanism::Threads));
        let refs: Vec<&FrameReport> = join.iter().collect();
        assert_eq!(
            code_frame(&refs, Mechanism::Threads).map(frame_text),
            Some("hash_lanes (lanes.node)".into())
        );
        // pthread_create further out, past the addon's own code, is not this write's.
        let own = [
            native("mmap64", LIBC),
            addon,
            native("pthread_create", LIBC),
        ];
        assert_eq!(of(&own, "mmap"), Some(Mechanism::Own));
    }

    #[test]
    fn malloc_is_an_arena_or_a_large_block_by_its_internals_or_its_cause() {
        let caller = native("vips_tracked_aligned_alloc", "/usr/lib/libvips.so.42");
        let grow = [
            native("__mprotect", LIBC),
            native("grow_heap", LIBC),
            native("sysmalloc", LIBC),
            native("_int_memalign", LIBC),
            native("posix_memalign", LIBC),
            caller.clone(),
        ];
        assert_eq!(of(&grow, "mprotect"), Some(Mechanism::Arena));
        let new_heap = [
            native("mmap64", LIBC),
            native("new_heap", LIBC),
            native("malloc", LIBC),
        ];
        assert_eq!(of(&new_heap, "mmap"), Some(Mechanism::Arena));
        let large = [
            native("mmap64", LIBC),
            native("sysmalloc_mmap.isra.0", LIBC),
            native("sysmalloc", LIBC),
            native("malloc", LIBC),
            caller.clone(),
        ];
        assert_eq!(of(&large, "mmap"), Some(Mechanism::LargeAlloc));
        // Bare addresses: mprotect and brk under malloc grow an arena, mmap and munmap are a
        // large block's.
        for (cause, m) in [
            ("mprotect", Mechanism::Arena),
            ("brk", Mechanism::Arena),
            ("mmap", Mechanism::LargeAlloc),
            ("munmap", Mechanism::LargeAlloc),
        ] {
            let frames = [
                native(cause, LIBC),
                native("0x7f00", LIBC),
                native("posix_memalign", LIBC),
                caller.clone(),
            ];
            assert_eq!(of(&frames, cause), Some(m), "{cause}");
        }
        let cxx = [
            native("munmap", LIBC),
            native("free", LIBC),
            native(
                "operator delete(void*)",
                "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
            ),
            caller,
        ];
        assert_eq!(of(&cxx, "munmap"), Some(Mechanism::LargeAlloc));
    }

    #[test]
    fn v8_wasm_the_loader_and_the_codes_own_calls() {
        let node = "/usr/bin/node";
        let v8 = [
            native("mmap64", LIBC),
            native("v8::base::OS::Allocate(void*, unsigned long)", node),
            native("v8::internal::MemoryAllocator::AllocatePage", node),
            native("v8::internal::Heap::Scavenge", node),
        ];
        assert_eq!(of(&v8, "mmap"), Some(Mechanism::V8Heap));
        let refs: Vec<&FrameReport> = v8.iter().collect();
        assert_eq!(
            code_frame(&refs, Mechanism::V8Heap).map(frame_text),
            Some("v8::internal::Heap::Scavenge (node)".into())
        );
        let wasm = [
            native("mprotect", LIBC),
            native("v8::base::OS::SetPermissions", node),
            native("v8::internal::BackingStore::GrowWasmMemoryInPlace", node),
            native("v8::internal::WasmMemoryObject::Grow", node),
        ];
        assert_eq!(of(&wasm, "mprotect"), Some(Mechanism::Wasm));
        let dlopen = [
            native("mmap64", "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
            native(
                "_dl_map_segments",
                "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            ),
            native("dlopen@@GLIBC_2.34", LIBC),
            native("uv_dlopen", node),
        ];
        assert_eq!(of(&dlopen, "mmap"), Some(Mechanism::FileMap));
        let unnamed = [
            native("munmap", LIBC),
            native("0x7f0a42b0", LIBC),
            native("0x7f0a8c52", LIBC),
            native("hash_lanes", "/t/lanes.node"),
        ];
        assert_eq!(of(&unnamed, "munmap"), Some(Mechanism::Unnamed));
        let own = [native("mmap64", LIBC), native("churn", "/t/churn.node")];
        assert_eq!(of(&own, "mmap"), Some(Mechanism::Own));
        assert_eq!(of(&own, "fork"), None);
        assert_eq!(of(&own, "read"), None);
        let js = [
            native("mmap64", LIBC),
            FrameReport {
                function: "grow".into(),
                script: Some("/srv/app.js".into()),
                line: Some(3),
                column: Some(9),
                ..FrameReport::default()
            },
        ];
        let refs: Vec<&FrameReport> = js.iter().collect();
        assert_eq!(js_frame(&refs), Some("grow (/srv/app.js:3:9)".into()));
    }
}
