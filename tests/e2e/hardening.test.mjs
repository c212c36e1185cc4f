// Resource exhaustion and shutdown, against `m3serve serve --fake-backend` as a process: the
// accept loop under a low open-file limit (no spinning, no hung connections), draining that keeps
// answering /health with 503, and a second signal that stops at once with every in-flight
// request ended cleanly.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import { serverBin, script, metrics, metricValue, startServer, waitFor, serverOnly } from './helpers.mjs';

const M = '{model_name="m3-tiny"';

// Starts the server under `ulimit -n <files>`; resolves with {url, port, proc, exited, log()}.
async function startLimited(files, extraArgs = []) {
  const proc = spawn('bash', ['-c', `ulimit -n ${files} && exec "$0" "$@"`, serverBin, 'serve',
    '--fake-backend', '--host', '127.0.0.1', '--port', '0', ...extraArgs],
  { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (d) => { log += d.toString(); });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const ok = await waitFor(() => /on http:\/\/[^:]+:(\d+)/.test(log), 15000);
  assert.ok(ok, `server did not start:\n${log}`);
  const port = Number(log.match(/on http:\/\/[^:]+:(\d+)/)[1]);
  return { port, url: `http://127.0.0.1:${port}`, proc, exited, log: () => log };
}

// CPU seconds (user + system) the process has used, from /proc/<pid>/stat.
function cpuSeconds(pid) {
  const fields = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;  // utime, stime in clock ticks
}

// Opens a connection, sends GET /health, resolves with the status (0: closed without one) or
// 'pending' if nothing arrived within `ms`. The socket stays open unless the server closes it.
function probe(port, ms, sockets) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    sockets.push(s);
    let buf = '';
    const timer = setTimeout(() => resolve('pending'), ms);
    s.on('connect', () => s.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n'));
    s.on('data', (d) => {
      buf += d.toString();
      if (buf.includes('\r\n\r\n')) { clearTimeout(timer); resolve(Number(buf.split(' ')[1])); }
    });
    s.on('error', () => {});
    s.on('close', () => { clearTimeout(timer); resolve(buf ? Number(buf.split(' ')[1]) : 0); });
  });
}

test('past --max-connections (derived from ulimit -n 128) every connection is answered', { skip: serverOnly }, async () => {
  const srv = await startLimited(128, ['--keep-alive-timeout', '30']);
  const sockets = [];
  try {
    const statuses = await Promise.all(Array.from({ length: 300 }, () => probe(srv.port, 5000, sockets)));
    const count = (s) => statuses.filter((x) => x === s).length;
    // The default cap for 128 descriptors is 64 connections. The rest are refused: a 503 while
    // few refusals are in flight, beyond that closed at once (each refusal holds a descriptor
    // until the client has read it). None is left hanging.
    assert.equal(count('pending'), 0, `hung connections: ${JSON.stringify(statuses)}`);
    assert.equal(count(200), 64, JSON.stringify(statuses));
    assert.ok(count(503) >= 16, JSON.stringify(statuses));
    assert.equal(count(503) + count(0), 236, JSON.stringify(statuses));
    const before = cpuSeconds(srv.proc.pid);
    await new Promise((r) => setTimeout(r, 1000));
    assert.ok(cpuSeconds(srv.proc.pid) - before < 0.3, 'the server is busy while idle');
  } finally {
    for (const s of sockets) s.destroy();
  }
  assert.ok(await waitFor(async () => (await fetch(`${srv.url}/health`)).status === 200, 5000));
  srv.proc.kill('SIGTERM');
  assert.equal((await srv.exited).code, 0, srv.log());
});

test('out of descriptors, the accept loop backs off instead of spinning, then recovers', { skip: serverOnly }, async () => {
  // A cap above what 128 descriptors allow: accept() itself fails with EMFILE.
  const srv = await startLimited(128, ['--max-connections', '100000', '--keep-alive-timeout', '30']);
  const sockets = [];
  try {
    const statuses = await Promise.all(Array.from({ length: 300 }, () => probe(srv.port, 3000, sockets)));
    const served = statuses.filter((x) => x === 200).length;
    assert.ok(served > 50 && served < 128, `served ${served}`);
    const before = cpuSeconds(srv.proc.pid);
    await new Promise((r) => setTimeout(r, 1000));
    const used = cpuSeconds(srv.proc.pid) - before;
    assert.ok(used < 0.3, `accept loop spinning: ${used} CPU s in 1 s`);
    assert.match(srv.log(), /cannot accept connections \(Too many open files/);
    // Closing the held connections frees descriptors: the waiting ones are then served.
    const held = sockets.splice(0, sockets.length);
    for (const s of held) s.destroy();
    assert.ok(await waitFor(async () => {
      try { return (await fetch(`${srv.url}/health`)).status === 200; } catch { return false; }
    }, 5000), srv.log());
  } finally {
    for (const s of sockets) s.destroy();
  }
  srv.proc.kill('SIGTERM');
  assert.equal((await srv.exited).code, 0, srv.log());
});

test('draining keeps answering: /health 503 and new work 503 on new connections', { skip: serverOnly }, async () => {
  const srv = await startServer([]);
  const inflight = srv.client.chat.completions.create({
    model: 'm3-tiny', messages: [{ role: 'user', content: script('y'.repeat(60), { stepMs: 20 }) }],
  });
  await waitFor(async () => metricValue(await metrics(srv.serverUrl), `m3serve:num_requests_running${M}`) === 1);
  srv.proc.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 100));
  const health = await fetch(`${srv.url}/health`);
  assert.equal(health.status, 503);
  assert.equal((await health.json()).error.code, 'draining');
  const refused = await fetch(`${srv.url}/v1/chat/completions`, {
    method: 'POST', body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }),
  });
  assert.equal(refused.status, 503);
  assert.equal((await refused.json()).error.code, 'draining');
  const done = await inflight;
  assert.equal(done.choices[0].message.content, 'y'.repeat(60));
  assert.equal((await srv.exited).code, 0, srv.log());
});

test('a second signal stops at once; in-flight streams end cleanly', { skip: serverOnly }, async () => {
  const srv = await startServer([]);
  const stream = await srv.client.chat.completions.create({
    model: 'm3-tiny', stream: true,
    messages: [{ role: 'user', content: script('z', { stepMs: 20, infinite: true }) }],
  });
  const chunks = [];
  const reading = (async () => { for await (const c of stream) chunks.push(c); })();
  await waitFor(() => chunks.length > 2);
  srv.proc.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(srv.proc.exitCode, null, 'the first signal drains');
  const t0 = Date.now();
  srv.proc.kill('SIGINT');
  const { code } = await srv.exited;
  assert.ok(Date.now() - t0 < 3000, `took ${Date.now() - t0} ms`);
  assert.equal(code, 1, 'not a clean drain');
  await reading;  // the stream ended (with [DONE]) rather than breaking off
  const last = chunks[chunks.length - 1];
  assert.equal(last.choices[0].finish_reason, 'abort', JSON.stringify(last));
  assert.match(srv.log(), /second signal: cancelling 1 request/);
});
