'use strict';
// mmaplock-prof's Node.js workload: k Worker threads (one process, one mm_struct, one
// mmap_lock) or one process of a group started side by side, each doing ITERATIONS reads of
// FILE. Prints "ready" once everything is started, waits for a line on stdin so that all
// participants and the profiler start together, then prints one JSON result line.
//
//   node workload.js workers K FILE ITERATIONS     the demo: fs.readFileSync, nothing else
//   node workload.js process 1 FILE ITERATIONS
//   node workload.js workers K FILE ITERATIONS STUDY SCENARIO [ADDON]
//                          the study: one of the scenarios of the module STUDY (study.js)
const { Worker, isMainThread, parentPort, workerData } = require('node:worker_threads');
const fs = require('node:fs');
const path = require('node:path');

// One thread's reads: the study's scenario, or readFileSync in a loop (bytes read).
async function work(data) {
  if (data.study) return require(data.study).work(data);
  let bytes = 0;
  for (let i = 0; i < data.iterations; i++) bytes += fs.readFileSync(data.file).length;
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
  parentPort.once('message', async () => {
    parentPort.postMessage({ bytes: await work(workerData) });
  });
  parentPort.postMessage('online');
} else {
  const [mode, kArg, file, itArg, study, scenario, addon] = process.argv.slice(2);
  const k = Number(kArg);
  const iterations = Number(itArg);
  const data = { file, iterations, scenario, addon, study: study && path.resolve(study) };
  const bad = data.study ? require(data.study).check(data) : null;
  if (!['workers', 'process'].includes(mode) || !(k > 0) || !file || !(iterations > 0) || bad) {
    process.stderr.write(
      `${bad || 'bad arguments'}\nusage: workload.js workers|process K FILE ITERATIONS [STUDY SCENARIO [ADDON]]\n`,
    );
    process.exit(2);
  }
  const finish = (t0, bytes) => {
    const elapsedMs = Number(process.hrtime.bigint() - t0) / 1e6;
    // A study's scenarios do not count their bytes.
    const read = Number.isFinite(bytes) ? { bytes } : {};
    process.stdout.write(JSON.stringify({ mode, k, ops: k * iterations, ...read, elapsed_ms: elapsedMs }) + '\n');
    process.exit(0);
  };
  if (mode === 'process') {
    waitForGo(async () => {
      const t0 = process.hrtime.bigint();
      finish(t0, await work(data));
    });
  } else {
    const workers = [];
    let online = 0;
    for (let i = 0; i < k; i++) {
      const w = new Worker(__filename, { workerData: data });
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
