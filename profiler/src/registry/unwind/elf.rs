//! What the unwinder keeps of one ELF file: its `.eh_frame` (and header) for framehop, its
//! load segments to place a mapping, and the stretches of code no FDE covers (V8's builtins).

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use framehop::ExplicitModuleSectionInfo;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};

use super::{Bytes, UnwindError};
use crate::registry::procmaps::Mapping;
use crate::registry::untrusted;

/// A `PT_LOAD` program header, used to turn a mapping into a load bias.
#[derive(Debug)]
struct LoadSegment {
    offset: u64,
    vaddr: u64,
    filesz: u64,
    exec: bool,
}

/// What we keep of one ELF file: the CFI sections and their SVMAs (addresses
/// as stated in the file), plus the load segments.
#[derive(Debug)]
pub(super) struct ElfUnwindInfo {
    text_svma: Option<Range<u64>>,
    got_svma: Option<Range<u64>>,
    eh_frame_svma: Range<u64>,
    eh_frame: Bytes,
    eh_frame_hdr: Option<(Range<u64>, Bytes)>,
    loads: Vec<LoadSegment>,
    /// Large stretches of executable code with no FDE (SVMAs): in node, V8's embedded
    /// builtins, whose frames are V8 frames (see `v8`).
    pub(super) gaps: Vec<Range<u64>>,
    /// The file's GNU build id (profiles name the file's exact build by it).
    pub(super) build_id: Option<Vec<u8>>,
    /// The same in hex, as every frame of the file is labelled with it (made once: made per
    /// frame, it was 4% of the agent's CPU with stacks sampled).
    pub(super) build_id_hex: Option<String>,
}

/// `bytes` in lowercase hex.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(2 * bytes.len()), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

impl ElfUnwindInfo {
    /// `path` is our own descriptor (`/proc/self/fd/N`) on the target's file, which
    /// [`readable_path`] opened safely and checked (registry::untrusted).
    pub(super) fn load(path: &Path) -> Result<Self, UnwindError> {
        let file = File::open(path).map_err(|source| UnwindError::Io {
            path: path.to_owned(),
            source,
        })?;
        let build_id = crate::registry::threadstart::elf_build_id(&file);
        let data = object::ReadCache::new(file);
        let elf_err = |source| UnwindError::Elf {
            path: path.to_owned(),
            source,
        };
        let header =
            object::elf::FileHeader64::<object::Endianness>::parse(&data).map_err(elf_err)?;
        let endian = header.endian().map_err(elf_err)?;
        let sections = header.sections(endian, &data).map_err(elf_err)?;
        let section = |name: &[u8]| sections.section_by_name(endian, name).map(|(_, s)| s);
        let svma = |s: &object::elf::SectionHeader64<object::Endianness>| {
            let start = s.sh_addr(endian);
            start..start + s.sh_size(endian)
        };
        let bytes = |s: &object::elf::SectionHeader64<object::Endianness>| {
            if s.sh_size(endian) > untrusted::MAX_UNWIND_SECTION {
                return Err(UnwindError::NoUnwindInfo(path.to_owned()));
            }
            s.data(endian, &data).map(Bytes::from).map_err(elf_err)
        };
        let eh = section(b".eh_frame").ok_or_else(|| UnwindError::NoUnwindInfo(path.to_owned()))?;
        let eh_frame_hdr = match section(b".eh_frame_hdr") {
            Some(s) => Some((svma(s), bytes(s)?)),
            None => None,
        };
        let loads = header
            .program_headers(endian, &data)
            .map_err(elf_err)?
            .iter()
            .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
            .map(|p| LoadSegment {
                offset: p.p_offset(endian),
                vaddr: p.p_vaddr(endian),
                filesz: p.p_filesz(endian),
                exec: p.p_flags(endian).0 & object::elf::PF_X.0 != 0,
            })
            .collect();
        let eh_frame = bytes(eh)?;
        let loads: Vec<LoadSegment> = loads;
        let text_svma = section(b".text").map(svma);
        let got_svma = section(b".got").map(svma);
        let gaps = fde_gaps(
            &eh_frame,
            svma(eh).start,
            eh_frame_hdr.as_ref(),
            text_svma.as_ref(),
            got_svma.as_ref(),
            &loads,
        );
        Ok(Self {
            text_svma,
            got_svma,
            eh_frame_svma: svma(eh),
            eh_frame,
            eh_frame_hdr,
            loads,
            gaps,
            build_id_hex: build_id.as_deref().map(hex),
            build_id,
        })
    }

    /// Load bias (AVMA of SVMA 0) of `map`: find the `PT_LOAD` whose pages
    /// cover the mapping's file offset; `vaddr - offset` is constant inside it.
    pub(super) fn bias(&self, map: &Mapping) -> Option<u64> {
        let covers = |l: &&LoadSegment| {
            (l.offset & !0xfff) <= map.offset && map.offset < l.offset + l.filesz
        };
        let seg = (self.loads.iter().filter(covers).find(|l| l.exec))
            .or_else(|| self.loads.iter().find(covers))?;
        Some(
            map.start
                .wrapping_sub(map.offset.wrapping_add(seg.vaddr.wrapping_sub(seg.offset))),
        )
    }

    /// framehop wants ELF modules described with `base_svma = 0` and
    /// `base_avma = load bias`; all section addresses stay SVMAs.
    pub(super) fn section_info(&self) -> ExplicitModuleSectionInfo<Bytes> {
        let (eh_frame_hdr_svma, eh_frame_hdr) = self.eh_frame_hdr.clone().unzip();
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text_svma.clone(),
            got_svma: self.got_svma.clone(),
            eh_frame_svma: Some(self.eh_frame_svma.clone()),
            eh_frame: Some(self.eh_frame.clone()),
            eh_frame_hdr_svma,
            eh_frame_hdr,
            ..Default::default()
        }
    }
}

/// Stretches of at least `MIN_GAP` bytes of the executable segments that no FDE covers. The
/// FDEs' starts come from `.eh_frame_hdr`'s sorted table when it has the usual encoding (the
/// FDE before a wide space between two starts is then the only one parsed), else from
/// walking `.eh_frame`.
fn fde_gaps(
    eh_frame: &[u8],
    eh_frame_svma: u64,
    hdr: Option<&(Range<u64>, Bytes)>,
    text: Option<&Range<u64>>,
    got: Option<&Range<u64>>,
    loads: &[LoadSegment],
) -> Vec<Range<u64>> {
    use gimli::UnwindSection;
    const MIN_GAP: u64 = 64 * 1024;
    let eh = gimli::EhFrame::new(eh_frame, gimli::LittleEndian);
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(eh_frame_svma);
    if let Some(t) = text {
        bases = bases.set_text(t.start);
    }
    if let Some(g) = got {
        bases = bases.set_got(g.start);
    }
    let fde_range = |offset: usize| {
        eh.fde_from_offset(
            &bases,
            gimli::EhFrameOffset(offset),
            gimli::EhFrame::cie_from_offset,
        )
        .ok()
        .map(|fde| (fde.initial_address(), fde.initial_address() + fde.len()))
    };
    let mut covered: Vec<(u64, u64)> = Vec::new();
    // version 1, pointer encodings, then (start, FDE) pairs as 32-bit offsets from the
    // header (DW_EH_PE_datarel | DW_EH_PE_sdata4 = 0x3b, the count as udata4 = 0x03).
    match hdr {
        Some((svma, b)) if b.len() >= 12 && b[0] == 1 && b[2] == 0x03 && b[3] == 0x3b => {
            let count = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")) as usize;
            let at = |i: usize| -> Option<(u64, u64)> {
                let e = b.get(12 + 8 * i..12 + 8 * i + 8)?;
                let start = i32::from_le_bytes(e[0..4].try_into().ok()?) as i64;
                let fde = i32::from_le_bytes(e[4..8].try_into().ok()?) as i64;
                Some((
                    svma.start.checked_add_signed(start)?,
                    svma.start.checked_add_signed(fde)?,
                ))
            };
            let entries: Vec<(u64, u64)> = (0..count).map_while(at).collect();
            for (i, &(start, fde)) in entries.iter().enumerate() {
                let next = entries.get(i + 1).map_or(u64::MAX, |e| e.0);
                // A function no longer than the space to the next: its end is its start.
                let end = if next - start >= MIN_GAP {
                    fde.checked_sub(eh_frame_svma)
                        .and_then(|o| fde_range(o as usize))
                        .map_or(start, |r| r.1)
                } else {
                    next.min(start + MIN_GAP)
                };
                covered.push((start, end));
            }
        }
        _ => {
            let mut entries = eh.entries(&bases);
            while let Ok(Some(entry)) = entries.next() {
                if let gimli::CieOrFde::Fde(partial) = entry
                    && let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset)
                {
                    covered.push((fde.initial_address(), fde.initial_address() + fde.len()));
                }
            }
            covered.sort_unstable();
        }
    }
    let mut gaps = Vec::new();
    for seg in loads.iter().filter(|l| l.exec) {
        let mut at = seg.vaddr;
        let end = seg.vaddr + seg.filesz;
        for &(s, e) in covered.iter().filter(|(s, e)| *e > seg.vaddr && *s < end) {
            if s > at && s - at >= MIN_GAP {
                gaps.push(at..s);
            }
            at = at.max(e);
        }
        if end > at && end - at >= MIN_GAP {
            gaps.push(at..end);
        }
    }
    gaps
}
