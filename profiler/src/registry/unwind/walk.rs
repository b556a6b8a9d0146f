//! Walking a copied stack: `.eh_frame` where the code has unwind entries, the frame pointer
//! chain where it has none (V8's code), and why the walk stops where it does.

use framehop::{FrameAddress, Unwinder};

use super::arch::{self, frame_pointer_step};
use super::{CodeKind, ProcessUnwinder, StackEnd, Unwound, UnwoundFrame, UserRegs};

impl ProcessUnwinder {
    /// Unwinds a copied stack from the registers `r` saved at kernel entry, innermost first
    /// (first = `r.ip`, the rest are raw return addresses), each frame with its frame
    /// pointer. Each frame is unwound with `.eh_frame`;
    /// where the code has no unwind entry (V8's builtins inside node's own `.text`) or no
    /// module (JIT code in anonymous memory), with the frame pointer chain, which V8 keeps in
    /// every frame it makes (JavaScript, builtin, stub, exit and entry frames alike). A return
    /// address outside the known mappings is looked up (code loaded or compiled since), as
    /// `procmaps::Lookups` allows. Memory is read only from `stack`, which holds
    /// the bytes at `[sp, sp + stack.len())`; [`Unwound::end`] says why the stack ends.
    pub fn unwind(&mut self, r: UserRegs, stack: &[u8], max_frames: usize) -> Unwound {
        let (ip, sp) = (r.ip, r.sp);
        let stack_end = sp.saturating_add(stack.len() as u64);
        let read_stack = |addr: u64| -> Result<u64, ()> {
            let off = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
            let bytes = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        // A read beyond the copy: the stack goes on where we cannot see it.
        let beyond = |addr: u64| addr >= stack_end;
        if self.code_kind(ip) == CodeKind::Unknown {
            self.cover(ip);
        }
        let mut regs = arch::regs(r, self.maps.highest_end());
        let mut frames = vec![UnwoundFrame { addr: ip, fp: r.fp }];
        let mut address = FrameAddress::from_instruction_pointer(ip);
        let end = loop {
            if frames.len() >= max_frames {
                break StackEnd::DepthLimit;
            }
            let mut read = read_stack;
            let next =
                match self
                    .unwinder
                    .unwind_frame(address, &mut regs, &mut self.cache, &mut read)
                {
                    Ok(Some(ra)) => ra,
                    Ok(None) => {
                        let last = frames.last().expect("one frame").addr;
                        break match self.code_kind(last) {
                            CodeKind::Native => StackEnd::Root,
                            _ => StackEnd::NoUnwindInfo,
                        };
                    }
                    Err(e) => match frame_pointer_step(&mut regs, &mut read) {
                        Some(ra) => ra,
                        None => {
                            break match e {
                                framehop::Error::CouldNotReadStack(a) if beyond(a) => {
                                    StackEnd::UnreadableMemory
                                }
                                _ if beyond(arch::fp(&regs)) => StackEnd::UnreadableMemory,
                                _ => StackEnd::NoUnwindInfo,
                            };
                        }
                    },
                };
            if self.code_kind(next) == CodeKind::Unknown && !self.cover(next) {
                break StackEnd::UnknownMapping;
            }
            frames.push(UnwoundFrame {
                addr: next,
                fp: arch::fp(&regs),
            });
            let Some(a) = FrameAddress::from_return_address(next) else {
                break StackEnd::NoUnwindInfo;
            };
            address = a;
        };
        Unwound { frames, end }
    }
}
