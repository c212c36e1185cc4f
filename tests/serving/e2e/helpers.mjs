// Shared by the serving e2e tests: start `m3serve serve` on the bundled model, wait for it to
// load, read /metrics.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '..', '..', '..');
export const serverBin = process.env.M3SERVE_BIN ?? path.join(repoRoot, 'build', 'bin', 'm3serve');
export const MODEL = 'm3-tiny';

export async function waitFor(pred, timeoutMs = 10000, stepMs = 25) {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await pred()) return true;
    await new Promise((r) => setTimeout(r, stepMs));
  }
  return false;
}

// Resolves once the model is loaded; rejects with the log if the server exits first.
export async function startServer(args) {
  // M3_SERVE_ARGS: flags added to every server the suite starts (the suite again under --tp 2).
  const extra = process.env.M3_SERVE_ARGS ? process.env.M3_SERVE_ARGS.split(' ').filter(Boolean) : [];
  const proc = spawn(serverBin, ['serve', '--host', '127.0.0.1', '--port', '0', ...extra, ...args],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 60000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/on http:\/\/[^:]+:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code}:\n${log}`));
    });
  });
  const url = `http://127.0.0.1:${port}`;
  const loaded = await waitFor(async () => {
    if (proc.exitCode !== null) return true;
    return (await fetch(`${url}/health`)).status === 200;
  }, 60000, 50);
  if (!loaded || proc.exitCode !== null) throw new Error(`the model did not load:\n${log}`);
  return {
    url,
    proc,
    exited,
    log: () => log,
    client: new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 }),
  };
}

// Runs `serve` expecting it to fail at load: resolves to { code, log }.
export async function serveExpectingFailure(args) {
  // M3_SERVE_ARGS, as startServer.
  const extra = process.env.M3_SERVE_ARGS ? process.env.M3_SERVE_ARGS.split(' ').filter(Boolean) : [];
  const proc = spawn(serverBin, ['serve', '--host', '127.0.0.1', '--port', '0', ...extra, ...args],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (d) => { log += d.toString(); });
  const code = await new Promise((resolve) => proc.on('exit', (c) => resolve(c)));
  return { code, log };
}

export async function stopServer(srv) {
  if (srv && srv.proc.exitCode === null) {
    srv.proc.kill('SIGTERM');
    return (await srv.exited).code;
  }
  return srv?.proc.exitCode;
}

export async function metricValue(srv, name) {
  const text = await (await fetch(`${srv.url}/metrics`)).text();
  for (const line of text.split('\n')) {
    if (line.startsWith(name + '{') || line.startsWith(name + ' ')) {
      return Number(line.slice(line.lastIndexOf(' ') + 1));
    }
  }
  return NaN;
}
