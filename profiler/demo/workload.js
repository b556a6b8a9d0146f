'use strict';
// mmaplock-prof's demo workload: k Worker threads (one process, one mm_struct, one mmap_lock)
// or one process of a group started side by side, each doing `iterations` fs.readFileSync of
// the same file. Prints "ready" once everything is started, waits for a line on stdin so that
// all participants and the profiler start together, then prints one JSON result line.
//
//   node workload.js workers K FILE ITERATIONS
//   node workload.js process 1 FILE ITERATIONS
const { Worker, isMainThread, parentPort, workerData } = require('node:worker_threads');
const fs = require('node:fs');

function readLoop(file, iterations) {
  let bytes = 0;
  for (let i = 0; i < iterations; i++) bytes += fs.readFileSync(file).length;
  return bytes;
}

function waitForGo(then) {
  process.stdout.write('ready\n');
  process.stdin.once('data', () => {
    process.stdin.pause();
    then();
  });
}

if (!isMainThread) {
  parentPort.once('message', () => {
    const bytes = readLoop(workerData.file, workerData.iterations);
    parentPort.postMessage({ bytes });
  });
  parentPort.postMessage('online');
} else {
  const [mode, kArg, file, itArg] = process.argv.slice(2);
  const k = Number(kArg);
  const iterations = Number(itArg);
  if (!['workers', 'process'].includes(mode) || !(k > 0) || !file || !(iterations > 0)) {
    process.stderr.write('usage: workload.js workers|process K FILE ITERATIONS\n');
    process.exit(2);
  }
  const finish = (t0, bytes) => {
    const elapsedMs = Number(process.hrtime.bigint() - t0) / 1e6;
    process.stdout.write(JSON.stringify({ mode, k, ops: k * iterations, bytes, elapsed_ms: elapsedMs }) + '\n');
    process.exit(0);
  };
  if (mode === 'process') {
    waitForGo(() => {
      const t0 = process.hrtime.bigint();
      finish(t0, readLoop(file, iterations));
    });
  } else {
    const workers = [];
    let online = 0;
    for (let i = 0; i < k; i++) {
      const w = new Worker(__filename, { workerData: { file, iterations } });
      w.once('message', () => {
        if (++online === k) start();
      });
      workers.push(w);
    }
    function start() {
      waitForGo(() => {
        const t0 = process.hrtime.bigint();
        let done = 0;
        let bytes = 0;
        for (const w of workers) {
          w.on('message', (m) => {
            bytes += m.bytes;
            if (++done === k) finish(t0, bytes);
          });
          w.postMessage('go');
        }
      });
    }
  }
}
