// Helpers for the end-to-end tests: start `m3serve serve --fake-backend` on a free port, script
// the fake model's output through the prompt, read metrics.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '..', '..');
export const serverBin =
  process.env.M3SERVE_BIN ?? path.join(repoRoot, 'build', 'bin', 'm3serve');

export const NS = ']<]minimax[>[';

// M3SERVE_E2E_VIA_ROUTER=1 runs the suite through `m3serve router`: startServer puts a router
// (one worker: the server) in front, and `url`, `port` and `client` are the router's, while
// `serverUrl` (its /metrics, the server's own counters), `proc`, `log` and `exited` stay the
// server's. Tests of the server process itself (signals, sockets, the loading window) run
// directly only; they say so with `serverOnly`.
export const viaRouter = process.env.M3SERVE_E2E_VIA_ROUTER === '1';
export const serverOnly = viaRouter && 'checks the server process itself (run without the router)';

// Spawns `m3serve args...`; resolves with {proc, port, exited, log()} once its stderr names the
// address it listens on.
async function spawnListening(args, what) {
  const proc = spawn(serverBin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} did not start:\n${log}`)), 15000);
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
      reject(new Error(`${what} exited with ${code}:\n${log}`));
    });
  });
  return { proc, port, exited, log: () => log };
}

const stopProcess = async ({ proc, exited }) => {
  if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
  return exited;
};

// Starts a server (behind a router with M3SERVE_E2E_VIA_ROUTER=1); resolves with {port, url,
// serverUrl, proc, client, stop()} once it listens.
export async function startServer(extraArgs = [], { apiKey } = {}) {
  const args = ['serve', '--fake-backend', '--host', '127.0.0.1', '--port', '0', ...extraArgs];
  if (apiKey) args.push('--api-key', apiKey);
  const server = await spawnListening(args, 'server');
  const serverUrl = `http://127.0.0.1:${server.port}`;
  let router = null;
  if (viaRouter) {
    const rargs = ['router', '--host', '127.0.0.1', '--port', '0', '--worker-urls', serverUrl,
                   '--health-check-interval-secs', '0.05'];
    if (apiKey) rargs.push('--api-key', apiKey);
    router = await spawnListening(rargs, 'router');
    // A test that ends the server itself (a signal) ends its router with it.
    server.exited.then(() => stopProcess(router));
  }
  const url = `http://127.0.0.1:${(router ?? server).port}`;
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: apiKey ?? 'unused', maxRetries: 0 });
  return {
    port: (router ?? server).port,
    url,
    serverUrl,
    proc: server.proc,
    client,
    exited: server.exited,
    log: () => (router ? `${server.log()}\n--- router ---\n${router.log()}` : server.log()),
    async stop() {
      if (router) await stopProcess(router);
      return stopProcess(server);
    },
  };
}

// A user message that makes the fake backend produce `text` (k tokens per step, optional flags).
export function script(text, { tps = 1, stepMs, infinite = false, error = false } = {}) {
  let s = `FAKE_OUTPUT_B64=${Buffer.from(text, 'utf8').toString('base64')} FAKE_TPS=${tps}`;
  if (stepMs !== undefined) s += ` FAKE_STEP_MS=${stepMs}`;
  if (infinite) s += ' FAKE_INFINITE';
  if (error) s += ' FAKE_ERROR';
  return s;
}

export const tag = (name, value) => `${NS}<${name}>${value}${NS}</${name}>`;
export const invoke = (name, body) => `${NS}<invoke name="${name}">${body}${NS}</invoke>`;
export const toolBlock = (...invokes) =>
  `${NS}<tool_call>\n${invokes.join('\n')}\n${NS}</tool_call>`;

export async function metrics(url, headers = {}) {
  const r = await fetch(`${url}/metrics`, { headers });
  return r.text();
}

// Value of a metric line that starts with `prefix` (labels included), or NaN.
export function metricValue(text, prefix) {
  for (const line of text.split('\n')) {
    if (line.startsWith(prefix)) return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return NaN;
}

export async function waitFor(pred, timeoutMs = 3000, stepMs = 20) {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await pred()) return true;
    await new Promise((r) => setTimeout(r, stepMs));
  }
  return false;
}

// Folds streamed chat chunks into {reasoning, content, toolCalls, finishReason, usage}.
export function foldChunks(chunks) {
  const out = { reasoning: '', content: '', toolCalls: [], finishReason: null, usage: null };
  for (const c of chunks) {
    if (c.usage) out.usage = c.usage;
    for (const ch of c.choices ?? []) {
      const d = ch.delta ?? {};
      if (d.reasoning_content) out.reasoning += d.reasoning_content;
      if (d.content) out.content += d.content;
      for (const tc of d.tool_calls ?? []) {
        if (tc.id) {
          if (tc.index !== out.toolCalls.length) throw new Error(`tool call index ${tc.index} out of order`);
          if (!tc.function?.name) throw new Error('a tool call began without its name');
          out.toolCalls.push({ id: tc.id, name: tc.function.name, arguments: '' });
        }
        const call = out.toolCalls[tc.index];
        if (!call) throw new Error(`arguments for unknown tool call ${tc.index}`);
        call.arguments += tc.function?.arguments ?? '';
      }
      if (ch.finish_reason) out.finishReason = ch.finish_reason;
    }
  }
  return out;
}
