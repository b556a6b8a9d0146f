//! The running kernel's BTF, parsed lazily: only the types looked up are decoded (a full
//! parse of its ~150k types costs tens of milliseconds, and seconds under emulation). sysfs
//! lets the file be mapped on recent kernels only; elsewhere (6.1, 6.12) its bytes are copied
//! into a memory file, which is mapped instead.

use std::{io::Write as _, path::Path};

use btf_rs::{Backend, Btf};

use super::btf::VMLINUX_BTF;

/// `/sys/kernel/btf/vmlinux`, mapped (or a copy of it, mapped).
pub fn open() -> Result<Btf, btf_rs::Error> {
    let path = Path::new(VMLINUX_BTF);
    Btf::from_file_with_backend(path, Backend::Mmap).or_else(|mapped| {
        let Ok(copy) = copy_to_memfd(path) else {
            return Err(mapped);
        };
        // The mapping outlives the descriptor, dropped on return.
        Btf::from_file_with_backend(format!("/proc/self/fd/{}", fd_of(&copy)), Backend::Mmap)
            .or_else(|_| Btf::from_file(path))
    })
}

fn copy_to_memfd(path: &Path) -> std::io::Result<std::fs::File> {
    let bytes = std::fs::read(path)?;
    let fd = rustix::fs::memfd_create("vmlinux-btf", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(&bytes)?;
    Ok(f)
}

fn fd_of(f: &std::fs::File) -> i32 {
    std::os::fd::AsRawFd::as_raw_fd(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The copy reads as the file does.
    #[test]
    fn a_copy_in_memory_is_read_like_the_file() {
        if !Path::new(VMLINUX_BTF).exists() {
            profiler_common::skip::skip_because(&format!("no {VMLINUX_BTF} on this kernel"));
            return;
        }
        let copy = copy_to_memfd(Path::new(VMLINUX_BTF)).unwrap();
        let btf =
            Btf::from_file_with_backend(format!("/proc/self/fd/{}", fd_of(&copy)), Backend::Mmap)
                .unwrap();
        let ids = btf.resolve_ids_by_name("task_struct").unwrap();
        assert!(!ids.is_empty());
        assert!(open().unwrap().resolve_ids_by_name("task_struct").is_ok());
    }
}
