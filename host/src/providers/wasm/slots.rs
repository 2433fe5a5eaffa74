//! The instance pool every run draws from, and how a used slot is made
//! pristine again for the next run.
//!
//! A run's instance lives in a slot of wasmtime's pooling allocator, whose
//! memory starts as a copy-on-write mapping of the snapshot's image. When the
//! instance is dropped its slot must read exactly as the image again: that is
//! the promise "a fresh instance per run, nothing carried between runs".
//!
//! There are two ways to get there. Discarding every page the run touched
//! (`madvise`) is always right, but the next run then takes a page fault on
//! each of them, about half of a bare run's time. Copying the image back over
//! just the pages the run wrote keeps them resident, and the next run takes
//! no fault. The second is used when the kernel can say which pages were
//! written (the `PAGEMAP_SCAN` ioctl, Linux 6.7 and later), with the scan's
//! question fixed in our build of wasmtime: upstream's asks only for written
//! pages that are *present*, so a written page that is swapped out or in
//! the middle of a migration at that moment would be neither copied over nor
//! discarded, and the next run would read it. Our build asks for written
//! pages that are present or swapped (the kernel shows a migrating page as
//! swapped too): scripts/patch-wasmtime.sh, docs/wasm-slot-reset.md. The
//! test `a_swapped_out_page_is_reset_too` shows a swapped-out page of one
//! instance gone in the next; it fails against the published wasmtime.

use wasmtime::{Enabled, PoolingAllocationConfig};

/// How much of a used memory (or table) is reset by copying at most: twice
/// what a small snippet writes (a bare run writes 31 pages, 124 KiB). Pages
/// kept resident count as written in every later scan, so this is also what
/// each reset of the slot copies at worst, and what an idle slot holds at
/// most. Past it, the rest of what a run wrote is discarded as before.
pub(super) const KEEP_RESIDENT: usize = 256 << 10;

/// Slot counts for `slots` runs in flight at once, each under
/// `memory_limit` bytes of linear memory.
pub(super) fn pool(
    slots: u32,
    fiber_stack_kept: usize,
    memory_limit: usize,
) -> PoolingAllocationConfig {
    let slots = slots.max(1);
    let mut pool = PoolingAllocationConfig::default();
    // One component instance, fiber stack and a few core instances,
    // memories and tables per run that may be in flight.
    pool.total_component_instances(slots)
        .total_stacks(slots)
        .async_stack_keep_resident(fiber_stack_kept)
        .total_core_instances(slots * 8)
        .total_memories(slots * 2)
        .total_tables(slots * 4)
        .max_memory_size(memory_limit);
    // Reset by copying only with the scan: without it wasmtime would copy
    // the lowest KEEP_RESIDENT bytes whether written or not, slower than
    // discarding. Tables go through the same scan and copy (a run's calls
    // through its tables would otherwise fault their pages in again).
    if PoolingAllocationConfig::is_pagemap_scan_available() {
        pool.linear_memory_keep_resident(KEEP_RESIDENT)
            .table_keep_resident(KEEP_RESIDENT)
            .pagemap_scan(Enabled::Yes);
    }
    pool
}

#[cfg(test)]
mod tests {
    //! The reset checked where it can go wrong: one slot, reused, with the
    //! pages of the previous instance in the states the kernel may leave
    //! them in. Core modules stand in for the guest component because they
    //! export their memory to the host; the pool and its reset are the same.

    use super::{KEEP_RESIDENT, pool};
    use std::io::{Read, Seek, SeekFrom};
    use wasmtime::{Config, Engine, Instance, InstanceAllocationStrategy, Module, Store};

    const PAGE: usize = 4096;
    /// Image bytes: three pages of data from offset 0, then zeros.
    const IMAGE_LEN: usize = 3 * PAGE;
    const IMAGE_BYTE: u8 = 0x5a;
    const SECRET: u8 = 0xc3;

    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn section(id: u8, body: &[u8], out: &mut Vec<u8>) {
        out.push(id);
        leb(body.len(), out);
        out.extend_from_slice(body);
    }

    /// A module with a 4-page (256 KiB) memory exported as `m`, and an
    /// active data segment of IMAGE_LEN bytes of IMAGE_BYTE at offset 0,
    /// which wasmtime turns into the slot's copy-on-write image.
    fn module_bytes() -> Vec<u8> {
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        section(5, &[1, 0x00, 4], &mut m);
        section(7, &[1, 1, b'm', 0x02, 0], &mut m);
        let mut data = vec![1, 0x00, 0x41, 0x00, 0x0b];
        leb(IMAGE_LEN, &mut data);
        data.extend(std::iter::repeat_n(IMAGE_BYTE, IMAGE_LEN));
        section(11, &data, &mut m);
        m
    }

    fn one_slot_engine() -> Engine {
        let mut cfg = Config::new();
        cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool(1, 0, 1 << 20)));
        Engine::new(&cfg).expect("engine")
    }

    /// The slot's memory base and the instance's store (which owns the slot
    /// until it is dropped).
    fn instantiate(engine: &Engine, module: &Module) -> (Store<()>, *mut u8) {
        let mut store = Store::new(engine, ());
        let instance = Instance::new(&mut store, module, &[]).expect("instantiate");
        let memory = instance.get_memory(&mut store, "m").expect("memory export");
        let base = memory.data_ptr(&store);
        (store, base)
    }

    /// This process's page-table entry for the page at `addr`, from
    /// /proc/self/pagemap: bit 63 present, bit 62 swapped.
    fn pagemap_entry(addr: *const u8) -> u64 {
        let mut f = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
        f.seek(SeekFrom::Start((addr as u64 / PAGE as u64) * 8))
            .expect("seek");
        let mut b = [0u8; 8];
        f.read_exact(&mut b).expect("read");
        u64::from_le_bytes(b)
    }
    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const FILE_OR_SHARED: u64 = 1 << 61;

    /// Swap space for the duration of a test, if the machine has none: a
    /// private swap file, switched off and removed on drop. Fails the test
    /// (never skips it) if swap cannot be had.
    struct Swap(Option<std::path::PathBuf>);

    impl Swap {
        fn ensure() -> Swap {
            let swaps = std::fs::read_to_string("/proc/swaps").expect("/proc/swaps");
            if swaps.lines().count() > 1 {
                return Swap(None);
            }
            // /var/tmp: disk-backed where /tmp may be tmpfs, which cannot swap.
            let path = std::path::Path::new("/var/tmp")
                .join(format!("plimsoll-test-swap-{}", std::process::id()));
            let run = |cmd: &str, args: &[&str]| {
                let ok = std::process::Command::new(cmd)
                    .args(args)
                    .stdout(std::process::Stdio::null())
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false);
                assert!(
                    ok,
                    "{cmd} {args:?} failed: this test needs swap (root, a swap-capable filesystem)"
                );
            };
            let p = path.to_str().expect("utf-8 temp dir");
            // Owned from here on, so a failed step still removes the file.
            let swap = Swap(Some(path.clone()));
            run("fallocate", &["-l", "32M", p]);
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .expect("chmod");
            run("mkswap", &[p]);
            run("swapon", &[p]);
            swap
        }
    }

    impl Drop for Swap {
        fn drop(&mut self) {
            if let Some(p) = &self.0 {
                let _ = std::process::Command::new("swapoff").arg(p).status();
                let _ = std::fs::remove_file(p);
            }
        }
    }

    fn assert_pristine(base: *const u8, what: &str) {
        // SAFETY: `base` is the live instance's memory, 256 KiB long.
        let mem = unsafe { std::slice::from_raw_parts(base, 4 * 65536) };
        assert!(
            mem[..IMAGE_LEN].iter().all(|&b| b == IMAGE_BYTE),
            "{what}: the image part differs from the image"
        );
        assert!(
            mem[IMAGE_LEN..].iter().all(|&b| b == 0),
            "{what}: the part past the image is not zero"
        );
    }

    #[test]
    fn the_scan_is_what_resets_slots_on_this_machine() {
        // The fast reset is the one under test below; on a kernel without
        // the scan the pool discards pages instead, and nothing is tested.
        assert!(
            wasmtime::PoolingAllocationConfig::is_pagemap_scan_available(),
            "PAGEMAP_SCAN unavailable: kernel 6.7 or later is needed"
        );
        const { assert!(KEEP_RESIDENT >= 64 * PAGE) };
    }

    #[test]
    fn a_written_page_is_copied_back_and_stays_resident() {
        let engine = one_slot_engine();
        let module = Module::new(&engine, module_bytes()).expect("module");
        let (store, base) = instantiate(&engine, &module);
        // SAFETY: within the first instance's live 256 KiB memory.
        unsafe {
            base.add(PAGE).write_bytes(SECRET, PAGE);
            base.add(16 * PAGE).write_bytes(SECRET, PAGE);
        }
        drop(store);
        let (_store, again) = instantiate(&engine, &module);
        assert_eq!(again, base, "one slot: the second instance reuses it");
        // Kept, not discarded: still this process's own page (present, not
        // the image file's), so the next run takes no fault on it. Looked at
        // before anything reads the slot, which would fault a discarded page
        // back in.
        let entry = pagemap_entry(again.wrapping_add(PAGE));
        assert!(
            entry & PRESENT != 0 && entry & FILE_OR_SHARED == 0,
            "the written page was discarded, not copied back (pagemap {entry:#x})"
        );
        assert_pristine(again, "after a reset");
    }

    #[test]
    fn a_swapped_out_page_is_reset_too() {
        let _swap = Swap::ensure();
        let engine = one_slot_engine();
        let module = Module::new(&engine, module_bytes()).expect("module");
        // Two rounds: the second starts from a slot the first left resident.
        for round in 0..2 {
            let (store, base) = instantiate(&engine, &module);
            for page in [PAGE, 16 * PAGE] {
                // SAFETY: within the live 256 KiB memory; page-aligned.
                unsafe {
                    let p = base.add(page);
                    p.write_bytes(SECRET, PAGE);
                    assert_eq!(
                        libc::madvise(p.cast(), PAGE, libc::MADV_PAGEOUT),
                        0,
                        "madvise(MADV_PAGEOUT)"
                    );
                }
                let entry = pagemap_entry(base.wrapping_add(page));
                assert!(
                    entry & SWAPPED != 0 && entry & PRESENT == 0,
                    "round {round}: page at {page:#x} was not swapped out (pagemap {entry:#x})"
                );
            }
            drop(store);
            let (_store, again) = instantiate(&engine, &module);
            assert_eq!(again, base);
            assert_pristine(again, &format!("round {round}: after a swapped-out page"));
        }
    }
}
