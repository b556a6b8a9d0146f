use std::{
    cell::Cell,
    time::{Duration, Instant},
};

use super::*;

/// A process whose mappings the test sets, counting what is read of them.
struct Fake {
    all: Vec<Mapping>,
    /// Whether it answers queries (a kernel with `PROCMAP_QUERY`).
    queries: bool,
    asked: Cell<u64>,
    read: Cell<u64>,
}

impl Fake {
    fn new(queries: bool) -> Self {
        Fake {
            all: vec![code(0x1000, 0x2000, Some("/usr/bin/node"))],
            queries,
            asked: Cell::new(0),
            read: Cell::new(0),
        }
    }
}

impl Source for Fake {
    fn read_all(&mut self) -> std::io::Result<Maps> {
        self.read.set(self.read.get() + 1);
        let mut v = self.all.clone();
        v.sort_by_key(|m| m.start);
        Ok(Maps(v))
    }

    fn query(&mut self, addr: u64) -> Option<std::io::Result<Option<Mapping>>> {
        if !self.queries {
            return None;
        }
        self.asked.set(self.asked.get() + 1);
        let found = self.all.iter().find(|m| m.start <= addr && addr < m.end);
        Some(Ok(found.cloned()))
    }
}

fn code(start: u64, end: u64, path: Option<&str>) -> Mapping {
    Mapping {
        start,
        end,
        exec: true,
        offset: 0,
        dev: "fe:01".into(),
        inode: u64::from(path.is_some()),
        path: path.map(Into::into),
        label: String::new(),
    }
}

#[test]
fn a_bucket_gives_its_burst_then_one_token_per_period() {
    let t0 = Instant::now();
    let every = Duration::from_millis(50);
    let mut b = TokenBucket::new(3, every);
    assert!((0..3).all(|_| b.take(t0)));
    assert!(!b.take(t0));
    assert!(!b.take(t0 + every - Duration::from_nanos(1)));
    assert!(b.take(t0 + every));
    assert!(!b.take(t0 + every));
    // Part of a period run is not lost: 1.5 periods later, one token; half a period more,
    // another.
    assert!(b.take(t0 + every * 2 + every / 2));
    assert!(b.take(t0 + every * 3));
    // A long pause fills it up to its capacity, no more.
    let later = t0 + every * 100;
    assert!((0..3).all(|_| b.take(later)));
    assert!(!b.take(later));
}

/// With the query: an address already covered reads nothing; an unknown one asks for its
/// mapping alone (never the whole map), at most the burst at once, then one per period; an
/// address no mapping covers is asked about again only as the bucket allows.
#[test]
fn with_the_query_only_the_covering_mapping_is_asked_for_as_the_bucket_allows() {
    let t0 = Instant::now();
    let mut src = Fake::new(true);
    let mut maps = src.read_all().unwrap();
    let mut l = Lookups::default();
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x1800, Keep::Exec, t0),
        Lookup::Known
    );
    assert_eq!(src.asked.get(), 0);
    // JIT code compiled since: its mapping is asked for and kept.
    src.all.push(code(0x9000, 0xa000, None));
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x9100, Keep::Exec, t0),
        Lookup::Added
    );
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x9200, Keep::Exec, t0),
        Lookup::Known
    );
    // `Code` keeps file-backed code only: JIT code is looked up, not kept.
    src.all.push(code(0xb000, 0xc000, None));
    let mut files = Maps::default();
    assert_eq!(
        l.cover(&mut src, &mut files, 0xb100, Keep::Code, t0),
        Lookup::Missing
    );
    // Garbage: asked about, not there; asked again until the burst is spent.
    let burst_left = QUERY_BURST - 2;
    for _ in 0..burst_left {
        assert_eq!(
            l.cover(&mut src, &mut maps, 0x66, Keep::Exec, t0),
            Lookup::Missing
        );
    }
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x66, Keep::Exec, t0),
        Lookup::Limited
    );
    assert_eq!(src.asked.get(), u64::from(QUERY_BURST));
    // One more per period.
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x66, Keep::Exec, t0 + QUERY_EVERY),
        Lookup::Missing
    );
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x66, Keep::Exec, t0 + QUERY_EVERY),
        Lookup::Limited
    );
    assert_eq!(src.read.get(), 1, "the whole map only at first");
    assert_eq!(
        (l.reads.map_queries, l.reads.maps),
        (u64::from(QUERY_BURST) + 1, 0)
    );
}

/// Without the query (before Linux 6.11): the whole map is read again for an unknown
/// address, `REREAD_BURST` times at once, then once per `REREAD_EVERY`; in between, unknown
/// addresses stay unknown.
#[test]
fn without_the_query_the_whole_map_is_read_again_as_its_bucket_allows() {
    let t0 = Instant::now();
    let mut src = Fake::new(false);
    let mut maps = src.read_all().unwrap();
    let mut l = Lookups::one_mapping();
    src.all.push(code(0x9000, 0xa000, None));
    src.all.push(code(0x5000, 0x6000, Some("/tmp/late.node")));
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x9100, Keep::Exec, t0),
        Lookup::Added
    );
    // Read whole: the other new mapping came with it.
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x5100, Keep::Exec, t0),
        Lookup::Known
    );
    for _ in 1..REREAD_BURST {
        assert_eq!(
            l.cover(&mut src, &mut maps, 0x66, Keep::Exec, t0),
            Lookup::Missing
        );
    }
    src.all.push(code(0xd000, 0xe000, None));
    let soon = t0 + REREAD_EVERY / 2;
    assert_eq!(
        l.cover(&mut src, &mut maps, 0xd100, Keep::Exec, soon),
        Lookup::Limited
    );
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x66, Keep::Exec, soon),
        Lookup::Limited
    );
    let burst = u64::from(REREAD_BURST);
    assert_eq!(src.read.get(), 1 + burst);
    let later = t0 + REREAD_EVERY;
    assert_eq!(
        l.cover(&mut src, &mut maps, 0xd100, Keep::Exec, later),
        Lookup::Added
    );
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x66, Keep::Exec, later),
        Lookup::Limited
    );
    assert_eq!(src.read.get(), 2 + burst);
    assert_eq!(src.asked.get(), 0);
    assert_eq!((l.reads.map_queries, l.reads.maps), (0, 1 + burst));
}

/// Over a run of any length, an address no mapping covers asked about every millisecond (a
/// process whose stacks keep ending in code unmapped since): the whole map is read again
/// `REREAD_BURST` times, then once per `REREAD_EVERY` (without the query), and the mapping
/// asked for `QUERY_BURST` times, then once per `QUERY_EVERY` (with it), never more: the
/// bounds tests/tests/maps_reads.rs takes for a whole run.
#[test]
fn over_a_run_the_reads_stay_within_the_burst_and_one_per_period() {
    let t0 = Instant::now();
    let run = Duration::from_millis(7_300);
    let ms = Duration::from_millis(1);
    for queries in [false, true] {
        let mut src = Fake::new(queries);
        let mut l = Lookups::one_mapping();
        let mut maps = l.read(&mut src, Keep::Exec).unwrap();
        let mut at = t0;
        while at <= t0 + run {
            assert_ne!(
                l.cover(&mut src, &mut maps, 0x66, Keep::Exec, at),
                Lookup::Added
            );
            at += ms;
        }
        let periods = |every: Duration| (run.as_nanos() / every.as_nanos()) as u64;
        let (asked, read) = if queries {
            (u64::from(QUERY_BURST) + periods(QUERY_EVERY), 1)
        } else {
            (0, 1 + u64::from(REREAD_BURST) + periods(REREAD_EVERY))
        };
        assert_eq!(
            (src.asked.get(), src.read.get()),
            (asked, read),
            "{queries}"
        );
        assert_eq!((l.reads.map_queries, l.reads.maps), (asked, read));
    }
}

/// For start routines: a query that finds file-backed code is followed by the whole map (the
/// addon loaded with the library it found comes too); one that finds anything else costs the
/// query alone.
#[test]
fn for_start_routines_a_library_found_brings_the_whole_map() {
    let t0 = Instant::now();
    let mut src = Fake::new(true);
    let mut maps = src.read_all().unwrap().retain(Keep::Code);
    let mut l = Lookups::whole_map();
    src.all
        .push(code(0x5000, 0x6000, Some("/app/node_modules/sharp.node")));
    src.all
        .push(code(0x7000, 0x8000, Some("/app/node_modules/libvips.so")));
    src.all.push(code(0x9000, 0xa000, None));
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x7100, Keep::Code, t0),
        Lookup::Added
    );
    assert_eq!((src.asked.get(), src.read.get()), (1, 2));
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x5100, Keep::Code, t0),
        Lookup::Known
    );
    // Anonymous code: no file to name, so not kept, and no whole read for it.
    assert_eq!(
        l.cover(&mut src, &mut maps, 0x9100, Keep::Code, t0),
        Lookup::Missing
    );
    assert_eq!((src.asked.get(), src.read.get()), (2, 2));
    assert_eq!((l.reads.map_queries, l.reads.maps), (2, 1));
}

/// A mapping asked for replaces the known ones it overlaps (unmapped since), and the map
/// stays sorted.
#[test]
fn an_answer_replaces_what_it_overlaps() {
    let mut maps = Maps(vec![
        code(0x1000, 0x2000, Some("/a")),
        code(0x3000, 0x5000, None),
        code(0x8000, 0x9000, Some("/b")),
    ]);
    maps.insert(code(0x4000, 0x6000, Some("/c")));
    let starts: Vec<u64> = maps.iter().map(|m| m.start).collect();
    assert_eq!(starts, [0x1000, 0x4000, 0x8000]);
    assert_eq!(
        maps.find(0x4800).and_then(|m| m.path.as_deref()),
        Some(std::path::Path::new("/c"))
    );
    assert!(maps.find(0x3800).is_none());
}

/// Two readers' first looks at a live process (this one) within a second share one read of
/// its map: the second counts none, and has the same mappings; after an exec (forgotten), or
/// for a later look again, it is read anew; a read again for an address (`cover`) is always
/// made.
#[test]
fn readers_first_looks_share_one_read() {
    let pid = std::process::id();
    forget_shared(pid);
    let (mut unwinding, mut roles) = (Lookups::one_mapping(), Lookups::whole_map());
    let first = unwinding.read(&mut Proc(pid), Keep::Code).unwrap();
    let second = roles.read(&mut Proc(pid), Keep::Code).unwrap();
    assert_eq!((unwinding.reads.maps, roles.reads.maps), (1, 0));
    assert!(first.iter().count() > 0);
    assert_eq!(
        first.iter().map(|m| m.start).collect::<Vec<_>>(),
        second.iter().map(|m| m.start).collect::<Vec<_>>()
    );
    forget_shared(pid);
    let mut after_exec = Lookups::one_mapping();
    after_exec.read(&mut Proc(pid), Keep::Code).unwrap();
    assert_eq!(after_exec.reads.maps, 1);
    let mut again = Lookups::one_mapping();
    again.read(&mut Proc(pid), Keep::Code).unwrap();
    assert_eq!(again.reads.maps, 0);
    // An address no mapping covers is looked for with a read (or a query) of its own.
    let mut maps = Maps::default();
    let before = (again.reads.maps, again.reads.map_queries);
    again.cover(&mut Proc(pid), &mut maps, 1, Keep::Code, Instant::now());
    assert_eq!(
        again.reads.maps + again.reads.map_queries,
        before.0 + before.1 + 1
    );
}
