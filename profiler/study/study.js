'use strict';
// mmaplock-prof study's scenarios: one mitigation idea of the investigation each, run by the
// demo's workload.js as k Worker threads (one process, one mmap_lock) or as one of k
// processes side by side, each doing ITERATIONS reads of FILE:
//
//   node workload.js workers K FILE ITERATIONS study.js SCENARIO [ADDON]
//   node workload.js process 1 FILE ITERATIONS study.js SCENARIO [ADDON]
const fs = require('node:fs');

// Each scenario: setup(file, size) -> async op() reading the whole file once.
const SCENARIOS = {
  // fs.readFileSync: a fresh Buffer per read (64 KiB and more: not from Buffer's pool).
  default: (file) => () => fs.readFileSync(file),
  // Buffer.poolSize = 256 KiB: readFileSync's Buffers under 128 KiB come from the pool.
  'pool-256k': (file) => {
    Buffer.poolSize = 256 * 1024;
    return () => fs.readFileSync(file);
  },
  // One preallocated Buffer, read into with openSync/readSync.
  reuse: (file, size) => {
    const buf = Buffer.allocUnsafeSlow(size);
    return () => readInto(file, buf, size);
  },
  // fs.promises.readFile, awaited one after the other.
  async: (file) => () => fs.promises.readFile(file),
  // readFileSync with MALLOC_ARENA_MAX=1 in the environment (set by the study).
  'arena-1': (file) => () => fs.readFileSync(file),
  // readFileSync with MALLOC_ARENA_MAX=2 (set by the study).
  'arena-2': (file) => () => fs.readFileSync(file),
  // readFileSync with jemalloc instead of glibc's malloc (LD_PRELOAD, set by the study).
  jemalloc: (file) => () => fs.readFileSync(file),
  // Buffers taken from a pool and given back by a FinalizationRegistry when the object that
  // lent them is collected.
  'finalization-pool': (file, size) => {
    const pool = [];
    const registry = new FinalizationRegistry((buf) => pool.push(buf));
    return () => {
      const buf = pool.pop() || Buffer.allocUnsafeSlow(size);
      const lease = { buf };
      registry.register(lease, buf);
      readInto(file, lease.buf, size);
      return lease.buf;
    };
  },
  // A per-thread bump slab: each read's Buffer is carved from a large slab, a new slab when
  // it is used up (for small Buffers: one allocation per many reads).
  slab: (file, size) => {
    const slabSize = Math.max(1024 * 1024, 4 * size);
    let slab = Buffer.allocUnsafeSlow(slabSize);
    let off = 0;
    return () => {
      if (off + size > slabSize) {
        slab = Buffer.allocUnsafeSlow(slabSize);
        off = 0;
      }
      const b = slab.subarray(off, off + size);
      off += (size + 7) & ~7;
      return readInto(file, b, size);
    };
  },
  // Buffers from a small N-API addon, given back explicitly with free() when done (the addon
  // keeps freed blocks for the next allocation).
  dispose: (file, size, addon) => {
    const native = require(addon);
    return () => {
      const ab = native.alloc(size);
      const b = Buffer.from(ab);
      readInto(file, b, size);
      native.free(ab);
    };
  },
};

function readInto(file, buf, size) {
  const fd = fs.openSync(file, 'r');
  try {
    let got = 0;
    while (got < size) {
      const n = fs.readSync(fd, buf, got, size - got, got);
      if (n === 0) break;
      got += n;
    }
    return buf;
  } finally {
    fs.closeSync(fd);
  }
}

// Every scenario gives the event loop a turn every YIELD_EVERY reads, as a server does
// between requests: without it a FinalizationRegistry's callbacks never run inside a
// synchronous loop (its pool would never be refilled), nor would anything else queued.
const YIELD_EVERY = 32;

// One thread's reads of FILE in the scenario (workload.js runs it).
async function work({ file, iterations, scenario, addon }) {
  const size = fs.statSync(file).size;
  const op = SCENARIOS[scenario](file, size, addon);
  for (let i = 0; i < iterations; i++) {
    const r = op();
    if (r && typeof r.then === 'function') await r;
    if (i % YIELD_EVERY === YIELD_EVERY - 1) await new Promise(setImmediate);
  }
}

// What is wrong with a scenario's arguments, or null.
function check({ scenario, addon }) {
  if (!(scenario in SCENARIOS)) return `unknown scenario ${scenario}`;
  if (scenario === 'dispose' && !addon) return 'the dispose scenario needs its ADDON';
  return null;
}

module.exports = { check, work };
