// A bounded soak of one live `m3serve serve` on the bundled model. WORKERS concurrent workers
// spend M3_SOAK_SECONDS (default 45) picking seeded random actions: valid requests on every route,
// malformed JSON, malformed HTTP on raw sockets, aborted requests and slow clients. Every response
// is checked: well-formed HTTP/1.1, OpenAI's error shape on every error, never a 500, only the
// statuses the server is meant to use. Afterwards the server must be idle again (nothing running
// or waiting, the KV pages of before the soak) and healthy, and it must never have exited.
//
// Replaying: the seed is printed; M3_SOAK_SEED=<seed> makes every worker pick the same actions
// with the same requests again (each action draws from its own generator, seeded by seed, worker
// and step, so a failure's "worker W step S" names one request exactly). The interleaving of the
// workers, and so the server's load at any moment, still depends on timing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { MODEL, startServer, stopServer, metricValue, waitFor } from './helpers.mjs';

const SOAK_SECONDS = Number(process.env.M3_SOAK_SECONDS ?? 45);
const SEED = process.env.M3_SOAK_SEED !== undefined
  ? Number(process.env.M3_SOAK_SEED) >>> 0
  : Math.floor(Math.random() * 2 ** 32);
const WORKERS = 6;

// The server's limits, passed on its command line. Few running and few queued requests, so that
// the six workers (some asking n=2) now and then fill the queue and 429 and its Retry-After are
// exercised, and aborted requests are sometimes still waiting when they go.
const MAX_RUNNING = 4;
const MAX_QUEUED = 6;
const MAX_BODY_BYTES = 1 << 20;  // small enough that a 413 costs little to provoke
// The server's default --keep-alive-timeout. Kept above undici's own keep-alive (4 s), so fetch()
// never reuses a pooled connection at the moment the server closes it.
const KEEP_ALIVE_S = 5;

const RAW_TIMEOUT_MS = 5000;       // a malformed request is answered (or dropped) well within this
const REQUEST_TIMEOUT_MS = 20000;  // a valid request, queueing included, on a busy 2-core machine
const MAX_BACKGROUND = 8;          // idle connections held at once by the slow-client actions

// Every status the server may answer with; anything else (500 above all) is a failure.
const EXPECTED_STATUSES = new Set([200, 400, 404, 405, 413, 429, 431, 501, 503]);
// A valid generation request can still meet a full queue.
const GENERATION_OK = [200, 429];
const FINISH_REASONS = new Set(['stop', 'length', 'tool_calls']);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const utf8 = new TextDecoder('utf-8', { fatal: true });

// ------------------------------------------------------------------------------------------------
// Seeded randomness

// mulberry32: tiny, and the same sequence on every platform for a given seed.
function makeRng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));  // lo..hi inclusive
  return {
    int,
    chance: (p) => next() < p,
    pick: (items) => items[Math.floor(next() * items.length)],
    bytes: (n, exclude = []) => {
      const out = [];
      while (out.length < n) {
        const b = int(0, 255);
        if (!exclude.includes(b)) out.push(b);
      }
      return Buffer.from(out);
    },
    // Picks an entry of [{ weight, ... }] in proportion to its weight.
    weighted: (entries) => {
      let x = next() * entries.reduce((s, e) => s + e.weight, 0);
      for (const e of entries) if ((x -= e.weight) < 0) return e;
      return entries[entries.length - 1];
    },
  };
}

// One 32-bit seed from several numbers (the run's seed, a worker, a step): a multiplicative hash,
// so that neighbouring workers and steps get unrelated sequences.
const mixSeed = (...parts) => parts.reduce((h, p) => Math.imul(h ^ (p >>> 0), 0x9e3779b1) ^ (h >>> 15), 0x85ebca6b);

// ------------------------------------------------------------------------------------------------
// Checking responses

// Text for a failure message: the bytes as a JSON string, long ones shortened in the middle.
function showBytes(data) {
  const b = Buffer.isBuffer(data) ? data : Buffer.from(data ?? '');
  let s;
  try {
    s = utf8.decode(b);
  } catch {
    s = b.toString('latin1');  // not UTF-8: one character per byte, so every byte is visible
  }
  if (s.length > 400) s = `${s.slice(0, 300)}…[${b.length} bytes]…${s.slice(-60)}`;
  return JSON.stringify(s);
}

// OpenAI's error object: {"error": {"message": string, "type": string, "param": ..., "code": ...}}.
function checkErrorBody(text) {
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    assert.fail(`an error response whose body is not JSON: ${showBytes(text)}`);
  }
  const e = json?.error;
  assert.ok(e && typeof e === 'object' && !Array.isArray(e), `no "error" object in ${showBytes(text)}`);
  assert.ok(typeof e.message === 'string' && e.message.length > 0, `error.message in ${showBytes(text)}`);
  assert.ok(typeof e.type === 'string' && e.type.length > 0, `error.type in ${showBytes(text)}`);
  assert.ok('param' in e && (e.param === null || typeof e.param === 'string'), `error.param in ${showBytes(text)}`);
  assert.ok('code' in e && (e.code === null || typeof e.code === 'string'), `error.code in ${showBytes(text)}`);
  return e;
}

// Decodes a body as UTF-8, refusing ill-formed bytes: every body this server sends is JSON, SSE
// of JSON, or the Prometheus text format, all of which must be UTF-8.
function decodeBody(body) {
  try {
    return utf8.decode(body);
  } catch {
    assert.fail(`a response body that is not UTF-8: ${showBytes(body)}`);
  }
}

// ------------------------------------------------------------------------------------------------
// HTTP/1.1 on raw sockets

// Parses the status line and header fields of a response starting at buf[start]: null while the
// header is incomplete; throws on anything that is not well-formed HTTP/1.1.
function parseHead(buf, start = 0) {
  const headEnd = buf.indexOf('\r\n\r\n', start);
  if (headEnd < 0) return null;
  const lines = buf.subarray(start, headEnd).toString('latin1').split('\r\n');
  const m = /^HTTP\/1\.1 ([1-5]\d\d) [^\r\n]*$/.exec(lines[0]);
  if (!m) throw new Error(`malformed status line ${showBytes(lines[0])}`);
  const headers = new Map();
  for (const line of lines.slice(1)) {
    // field-name is a token (RFC 9110 5.1); the value has no CR, LF or NUL.
    const h = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\r\n\0]*?)[ \t]*$/.exec(line);
    if (!h) throw new Error(`malformed header field ${showBytes(line)}`);
    const name = h[1].toLowerCase();
    headers.set(name, headers.has(name) ? `${headers.get(name)}, ${h[2]}` : h[2]);
  }
  return { status: Number(m[1]), headers, bodyStart: headEnd + 4 };
}

// Parses one complete response at buf[start]: null while incomplete, else
// { status, headers, text, end }. The body must be framed by Content-Length or by a well-formed
// chunked encoding (this server always frames its bodies: it never delimits one by closing).
function parseResponse(buf, start = 0) {
  const head = parseHead(buf, start);
  if (!head) return null;
  const { status, headers } = head;
  if (status < 200) throw new Error(`an interim ${status} response to a request that did not ask for one`);
  const te = headers.get('transfer-encoding');
  const cl = headers.get('content-length');
  let pos = head.bodyStart;
  let body;
  if (te !== undefined) {
    if (cl !== undefined) throw new Error('a response with both Transfer-Encoding and Content-Length');
    if (te.toLowerCase() !== 'chunked') throw new Error(`Transfer-Encoding ${showBytes(te)}`);
    const parts = [];
    for (;;) {
      const lineEnd = buf.indexOf('\r\n', pos);
      if (lineEnd < 0) return null;
      const sizeText = buf.subarray(pos, lineEnd).toString('latin1');
      if (!/^[0-9a-fA-F]{1,8}$/.test(sizeText)) throw new Error(`malformed chunk size ${showBytes(sizeText)}`);
      const size = parseInt(sizeText, 16);
      pos = lineEnd + 2;
      if (size === 0) break;
      if (buf.length < pos + size + 2) return null;
      parts.push(buf.subarray(pos, pos + size));
      if (buf[pos + size] !== 0x0d || buf[pos + size + 1] !== 0x0a) throw new Error('a chunk not followed by CRLF');
      pos += size + 2;
    }
    // The trailer section: field lines up to an empty line.
    for (;;) {
      const lineEnd = buf.indexOf('\r\n', pos);
      if (lineEnd < 0) return null;
      const line = buf.subarray(pos, lineEnd).toString('latin1');
      pos = lineEnd + 2;
      if (line === '') break;
      if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\r\n\0]*$/.test(line)) throw new Error(`malformed trailer ${showBytes(line)}`);
    }
    body = Buffer.concat(parts);
  } else if (cl !== undefined) {
    if (!/^\d+$/.test(cl)) throw new Error(`malformed Content-Length ${showBytes(cl)}`);
    if (buf.length < pos + Number(cl)) return null;
    body = buf.subarray(pos, pos + Number(cl));
    pos += Number(cl);
  } else {
    throw new Error(`a ${status} response with neither Content-Length nor Transfer-Encoding`);
  }
  return { status, headers, text: decodeBody(body), end: pos };
}

// All the complete responses in buf; `rest` is what follows the last of them.
function parseResponses(buf) {
  const responses = [];
  let pos = 0;
  for (let r; pos < buf.length && (r = parseResponse(buf, pos)); pos = r.end) responses.push(r);
  return { responses, rest: buf.subarray(pos) };
}

// Opens a connection, writes `parts` one after another (`gapMs` apart), optionally half-closes,
// and collects what the server sends until:
// - the server closes the connection (`closed`),
// - `until(bytesSoFar)` returns true (`stopped`: we close),
// - `abortAfterMs` passes (`aborted`: we close, as a client that gives up would),
// - or `timeoutMs` passes (`timedOut`: a hang, which the caller reports).
// Resolves to { data, closed, stopped, aborted, timedOut, error }; never rejects.
function rawExchange(port, parts, { gapMs = 0, halfClose = false, until, abortAfterMs, timeoutMs = RAW_TIMEOUT_MS } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    const chunks = [];
    let error = null;
    let done = false;
    const timers = [];
    const finish = (how) => {
      if (done) return;
      done = true;
      for (const t of timers) clearTimeout(t);
      sock.destroy();
      resolve({ data: Buffer.concat(chunks), closed: how === 'closed', stopped: how === 'stopped',
        aborted: how === 'aborted', timedOut: how === 'timeout', error });
    };
    timers.push(setTimeout(() => finish('timeout'), timeoutMs));
    if (abortAfterMs !== undefined) timers.push(setTimeout(() => finish('aborted'), abortAfterMs));
    sock.on('data', (d) => {
      chunks.push(d);
      if (until && until(Buffer.concat(chunks))) finish('stopped');
    });
    sock.on('end', () => finish('closed'));  // the server's FIN: everything it sent has arrived
    sock.on('close', () => finish('closed'));
    sock.on('error', (e) => { error = e; });  // a reset or a refused write; 'close' follows
    sock.on('connect', async () => {
      for (const [i, p] of parts.entries()) {
        if (i > 0 && gapMs > 0) await sleep(gapMs);
        if (done) return;
        sock.write(p);
      }
      if (halfClose && !done) sock.end();
    });
  });
}

// `until` for rawExchange: stop once `count` complete responses arrived (or the bytes cannot be
// parsed, which the caller's own parse then reports).
const afterResponses = (count) => (buf) => {
  try {
    return parseResponses(buf).responses.length >= count;
  } catch {
    return true;
  }
};

// A request's bytes: the header block with Host and, for a body, Content-Length.
function httpRequest(method, path, body, extraHeaders = '') {
  const b = body === undefined ? Buffer.alloc(0) : Buffer.from(body);
  const length = body === undefined ? '' : `Content-Type: application/json\r\nContent-Length: ${b.length}\r\n`;
  return Buffer.concat([Buffer.from(`${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n${length}${extraHeaders}\r\n`), b]);
}

// ------------------------------------------------------------------------------------------------
// The soak's bookkeeping

class Soak {
  constructor(srv, seed) {
    this.srv = srv;
    this.port = Number(new URL(srv.url).port);
    this.seed = seed;
    this.kinds = new Map();     // action kind -> count
    this.statuses = new Map();  // HTTP status -> count
    this.failures = [];
    this.inFlight = new Set();  // the actions running now: a crash names them
    this.recent = [];           // the last actions started, in case the culprit already ended
    this.background = new Set();
    this.stopped = false;
  }

  count(kind) { this.kinds.set(kind, (this.kinds.get(kind) ?? 0) + 1); }

  fail(ctx, error) {
    this.failures.push({ where: `worker ${ctx.worker} step ${ctx.step} (${ctx.kind})`, request: ctx.request,
      message: error?.message ?? String(error) });
  }

  // The checks every response gets, whatever sent it: counted, never a 500, a status from the
  // expected set and from `allowed` (this action's own expectation), OpenAI's error shape on
  // every error, Retry-After on a 429. Returns the error object of an error response.
  observe(ctx, { status, header, text }, allowed) {
    this.statuses.set(status, (this.statuses.get(status) ?? 0) + 1);
    assert.notEqual(status, 500, `a 500 (the server failed on input it should classify): ${showBytes(text)}`);
    assert.ok(EXPECTED_STATUSES.has(status), `unexpected status ${status}: ${showBytes(text)}`);
    assert.ok(allowed.includes(status), `status ${status}, expected ${allowed.join(' or ')}: ${showBytes(text)}`);
    if (status === 429) {
      assert.match(header('retry-after') ?? '', /^\d+$/, 'a 429 without a Retry-After of seconds');
    }
    return status >= 400 ? checkErrorBody(text) : null;
  }

  // fetch() with the checks above. `signal` aborts as a client that gives up; the time limit is a
  // hang, reported as one.
  async fetch(ctx, method, path, body, allowed, { signal, headers } = {}) {
    ctx.request = `${method} ${path} ${body === undefined ? '' : showBytes(body)}`;
    const limit = AbortSignal.timeout(REQUEST_TIMEOUT_MS);
    let r;
    let data;
    try {
      r = await fetch(`${this.srv.url}${path}`, {
        method, body, headers: { 'content-type': 'application/json', ...headers },
        signal: signal ? AbortSignal.any([signal, limit]) : limit,
      });
      data = Buffer.from(await r.arrayBuffer());
    } catch (e) {
      if (limit.aborted) throw new Error(`no response within ${REQUEST_TIMEOUT_MS / 1000} s`);
      if (signal?.aborted) throw e;  // the caller's own abort
      throw new Error(`${e.message}${e.cause ? ` (${e.cause.code ?? e.cause.message})` : ''}`);
    }
    const res = { status: r.status, header: (n) => r.headers.get(n), text: decodeBody(data) };
    return { ...res, error: this.observe(ctx, res, allowed) };
  }

  // The checks for one raw-socket response (a parsed one: see parseResponse).
  observeRaw(ctx, r, allowed) {
    return this.observe(ctx, { status: r.status, header: (n) => r.headers.get(n), text: r.text }, allowed);
  }
}

// ------------------------------------------------------------------------------------------------
// Valid requests

const PROMPTS = ['What is 47 + 35?', 'Hello!', 'Name a colour.', 'Say one word.', 'Ünïcødé ✓ 日本語 🙂'];

// A small generation request (max_tokens <= 16), sometimes with n=2 and logprobs.
function generationBody(rng, chat) {
  const body = { model: MODEL, max_tokens: rng.int(1, 16) };
  if (chat) body.messages = [{ role: 'user', content: rng.pick(PROMPTS) }];
  else body.prompt = rng.pick(PROMPTS);
  if (rng.chance(0.5)) body.temperature = rng.pick([0, 0.7, 1]);
  if (rng.chance(0.5)) body.seed = rng.int(0, 1e6);
  if (rng.chance(0.3)) body.n = 2;
  if (rng.chance(0.3)) {
    if (chat) Object.assign(body, { logprobs: true, top_logprobs: rng.int(0, 3) });
    else body.logprobs = rng.int(0, 3);
  }
  if (chat && rng.chance(0.3)) body.thinking = { type: rng.pick(['enabled', 'disabled', 'adaptive']) };
  if (rng.chance(0.2)) body.ignore_eos = true;
  return body;
}

function checkCompletion(json, body, chat) {
  const n = body.n ?? 1;
  assert.equal(json.object, chat ? 'chat.completion' : 'text_completion');
  assert.deepEqual(json.choices.map((c) => c.index).sort(), [...Array(n).keys()], 'choice indexes');
  for (const c of json.choices) {
    assert.ok(FINISH_REASONS.has(c.finish_reason), `finish_reason ${c.finish_reason}`);
    if (chat) assert.equal(c.message.role, 'assistant');
    else assert.equal(typeof c.text, 'string');
    if (body.logprobs !== undefined) assert.ok(c.logprobs && typeof c.logprobs === 'object', 'logprobs asked for, none given');
  }
  const u = json.usage;
  assert.ok(u.completion_tokens >= 1 && u.completion_tokens <= n * body.max_tokens, `usage ${JSON.stringify(u)}`);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
}

// A complete event stream: `data: <json>` events, one finish_reason per choice, no error event,
// usage when asked for, and `data: [DONE]` last.
function checkEventStream(text, body, chat) {
  assert.ok(text.endsWith('data: [DONE]\n\n'), `the stream does not end with [DONE]: ${showBytes(text.slice(-200))}`);
  const events = text.split('\n\n').slice(0, -2);  // less [DONE] and the empty tail
  const finished = new Map();
  let usage = null;
  for (const ev of events) {
    if (ev.startsWith(':')) continue;  // an SSE comment (a keep-alive)
    assert.ok(ev.startsWith('data: ') && !ev.includes('\n'), `malformed SSE event ${showBytes(ev)}`);
    const chunk = JSON.parse(ev.slice(6));
    assert.ok(!chunk.error, `an error event in the stream: ${ev}`);
    assert.equal(chunk.object, chat ? 'chat.completion.chunk' : 'text_completion');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (!c.finish_reason) continue;
      assert.ok(!finished.has(c.index), `choice ${c.index} finished twice`);
      assert.ok(FINISH_REASONS.has(c.finish_reason), `finish_reason ${c.finish_reason}`);
      finished.set(c.index, c.finish_reason);
    }
  }
  assert.equal(finished.size, body.n ?? 1, 'choices finished');
  if (body.stream_options?.include_usage) assert.ok(usage?.completion_tokens >= 1, 'no usage chunk');
}

async function validGeneration(ctx, chat, stream) {
  ctx.kind = `valid:${chat ? 'chat' : 'completion'}${stream ? '-stream' : ''}`;
  const body = generationBody(ctx.rng, chat);
  if (stream) {
    body.stream = true;
    if (ctx.rng.chance(0.5)) body.stream_options = { include_usage: true };
  }
  const path = chat ? '/v1/chat/completions' : '/v1/completions';
  const r = await ctx.soak.fetch(ctx, 'POST', path, JSON.stringify(body), GENERATION_OK);
  if (r.status !== 200) return;
  if (stream) checkEventStream(r.text, body, chat);
  else checkCompletion(JSON.parse(r.text), body, chat);
}

async function validModels(ctx) {
  const r = await ctx.soak.fetch(ctx, 'GET', '/v1/models', undefined, [200]);
  assert.equal(JSON.parse(r.text).data[0].id, MODEL);
}

async function validHealth(ctx) {
  await ctx.soak.fetch(ctx, 'GET', '/health', undefined, [200]);
}

async function validMetrics(ctx) {
  const r = await ctx.soak.fetch(ctx, 'GET', '/metrics', undefined, [200]);
  assert.ok(r.text.includes('m3serve:num_requests_running'), 'no num_requests_running in /metrics');
}

// /tokenize (a prompt or messages), then /detokenize of the ids it gave.
async function validTokenize(ctx) {
  const { rng, soak } = ctx;
  const body = rng.chance(0.5) ? { prompt: rng.pick(PROMPTS) }
    : { messages: [{ role: 'user', content: rng.pick(PROMPTS) }] };
  const t = JSON.parse((await soak.fetch(ctx, 'POST', '/tokenize', JSON.stringify(body), [200])).text);
  assert.ok(Array.isArray(t.tokens) && t.tokens.length === t.count, `tokenize gave ${JSON.stringify(t)}`);
  const d = await soak.fetch(ctx, 'POST', '/detokenize', JSON.stringify({ tokens: t.tokens }), [200]);
  assert.equal(typeof JSON.parse(d.text).prompt, 'string');
}

// The error statuses of well-formed HTTP: an unknown route, a wrong method, a body too large.
async function routeErrors(ctx) {
  const { rng, soak } = ctx;
  const which = rng.pick(['404', '405', '413']);
  ctx.kind = `valid:http-${which}`;
  if (which === '404') {
    await soak.fetch(ctx, rng.pick(['GET', 'POST']), rng.pick(['/v1/nothing', '/v2/chat/completions', '/%ff', '/health/x']),
      undefined, [404]);
  } else if (which === '405') {
    const [method, path] = rng.pick([['GET', '/v1/chat/completions'], ['DELETE', '/v1/models'],
      ['PUT', '/v1/completions'], ['GET', '/tokenize'], ['POST', '/health']]);
    await soak.fetch(ctx, method, path, method === 'GET' || method === 'DELETE' ? undefined : '{}', [405]);
  } else {
    const body = JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(MAX_BODY_BYTES + rng.int(1, 4096)) }] });
    const r = await soak.fetch(ctx, 'POST', '/v1/chat/completions', body, [413]);
    assert.equal(r.error.code, 'request_too_large');
  }
}

// Several requests written at once on one connection (pipelining): as many responses, in order,
// each well-formed, then the server closes after the one that asked it to.
async function pipelined(ctx) {
  const { rng, soak } = ctx;
  const reqs = [];
  const expectJson = [];
  for (let i = rng.int(2, 4); i > 0; --i) {
    const close = i === 1 ? 'Connection: close\r\n' : '';
    const which = rng.pick(['health', 'models', 'tokenize']);
    expectJson.push(which);
    if (which === 'health') reqs.push(httpRequest('GET', '/health', undefined, close));
    else if (which === 'models') reqs.push(httpRequest('GET', '/v1/models', undefined, close));
    else reqs.push(httpRequest('POST', '/tokenize', JSON.stringify({ prompt: rng.pick(PROMPTS) }), close));
  }
  const wire = Buffer.concat(reqs);
  ctx.request = `raw ${showBytes(wire)}`;
  const x = await rawExchange(soak.port, [wire]);
  assert.ok(!x.timedOut, `no answer to ${reqs.length} pipelined requests within ${RAW_TIMEOUT_MS} ms`);
  const { responses, rest } = parseResponses(x.data);
  for (const r of responses) soak.observeRaw(ctx, r, [200]);
  assert.equal(responses.length, reqs.length, `responses to pipelined requests; got ${showBytes(x.data)}`);
  assert.equal(rest.length, 0, `bytes after the last response: ${showBytes(rest)}`);
  assert.ok(x.closed, 'the connection stayed open after Connection: close');
}

// ------------------------------------------------------------------------------------------------
// Malformed JSON bodies: each one a 400 in OpenAI's error shape

const deepArrays = (n) => '['.repeat(n) + ']'.repeat(n);
const deepObjects = (n) => '{"a":'.repeat(n) + '1' + '}'.repeat(n);

// `obj` as JSON text with its string value "@RAW@" replaced by `rawText` (JSON that
// JSON.stringify could not produce: too deep for it, unclosed, or numbers that overflow).
function withRaw(obj, rawText) {
  return JSON.stringify(obj).replace('"@RAW@"', rawText);
}

const chatMessages = (content = 'hi') => [{ role: 'user', content }];

// [name, path, body text, expected param] for the wrong-type cases.
const WRONG_TYPES = [
  ['temperature-string', '/v1/chat/completions', { messages: chatMessages(), temperature: 'hot' }, 'temperature'],
  ['messages-number', '/v1/chat/completions', { messages: 5 }, 'messages'],
  ['tools-type-number', '/v1/chat/completions', { messages: chatMessages(), tools: [{ type: 5 }] }, 'tools[0].type'],
  ['stop-token-ids-2^32', '/v1/chat/completions', '{"messages":[{"role":"user","content":"hi"}],"stop_token_ids":[4294967296]}', 'stop_token_ids'],
  ['prompt-negative-id', '/v1/completions', { prompt: [-1] }, 'prompt'],
  ['logit-bias-plus-key', '/v1/completions', { prompt: 'hi', logit_bias: { '+5': 1 } }, 'logit_bias'],
  ['max-tokens-string', '/v1/chat/completions', { messages: chatMessages(), max_tokens: '16' }, 'max_tokens'],
  ['n-string', '/v1/chat/completions', { messages: chatMessages(), n: '2' }, 'n'],
  ['stream-string', '/v1/chat/completions', { messages: chatMessages(), stream: 'yes' }, 'stream'],
  ['role-number', '/v1/chat/completions', { messages: [{ role: 5, content: 'hi' }] }, 'messages[0].role'],
  ['content-object', '/v1/chat/completions', { messages: [{ role: 'user', content: {} }] }, 'messages[0].content'],
  ['stop-number', '/v1/chat/completions', { messages: chatMessages(), stop: 5 }, 'stop'],
  ['logprobs-string', '/v1/chat/completions', { messages: chatMessages(), logprobs: 'yes' }, 'logprobs'],
  ['chat-template-kwargs-number', '/v1/chat/completions', { messages: chatMessages(), chat_template_kwargs: 5 }, 'chat_template_kwargs'],
  ['tool-choice-number', '/v1/chat/completions', { messages: chatMessages(), tool_choice: 5 }, 'tool_choice'],
  ['detokenize-tokens-string', '/detokenize', { tokens: 'abc' }, 'tokens'],
  ['tokenize-messages-string', '/tokenize', { messages: 'x' }, 'messages'],
];

// Fields where a number that overflows a double (1e999) is sent; JSON parsers must refuse it.
const OVERFLOW_FIELDS = [
  ['/v1/chat/completions', (v) => `{"messages":[{"role":"user","content":"hi"}],"temperature":${v}}`],
  ['/v1/chat/completions', (v) => `{"messages":[{"role":"user","content":"hi"}],"max_tokens":${v}}`],
  ['/v1/chat/completions', (v) => `{"messages":[{"role":"user","content":"hi"}],"seed":${v}}`],
  ['/v1/chat/completions', (v) => `{"messages":[{"role":"user","content":"hi"}],"top_p":${v}}`],
  ['/v1/completions', (v) => `{"prompt":"hi","logit_bias":{"5":${v}}}`],
  ['/v1/completions', (v) => `{"prompt":[${v}]}`],
  ['/detokenize', (v) => `{"tokens":[1,${v}]}`],
];

// Where a deeply nested value goes (each given the nested JSON text).
const DEEP_PLACES = [
  ['messages.content', '/v1/chat/completions', (d) => withRaw({ messages: chatMessages('@RAW@') }, d)],
  ['tools.parameters', '/v1/chat/completions', (d) => withRaw({ messages: chatMessages(),
    tools: [{ type: 'function', function: { name: 'f', parameters: '@RAW@' } }] }, d)],
  ['chat_template_kwargs', '/v1/chat/completions', (d) => withRaw({ messages: chatMessages(), chat_template_kwargs: { x: '@RAW@' } }, d)],
  ['logit_bias', '/v1/completions', (d) => withRaw({ prompt: 'hi', logit_bias: { 5: '@RAW@' } }, d)],
  ['tokenize.messages.content', '/tokenize', (d) => withRaw({ messages: chatMessages('@RAW@') }, d)],
];

// Bytes that are not UTF-8 (or escapes that are not Unicode scalar values) inside a string.
const BAD_UTF8 = [
  ['ff-fe', [0xff, 0xfe]],
  ['overlong-slash', [0xc0, 0xaf]],
  ['utf16-surrogate', [0xed, 0xa0, 0x80]],
  ['above-10ffff', [0xf4, 0x90, 0x80, 0x80]],
  ['truncated-sequence', [0xe2, 0x82]],
  ['lone-surrogate-escape', [...Buffer.from('\\ud800')]],
  ['lone-low-surrogate-escape', [...Buffer.from('\\udc00x')]],
];

async function malformedJson(ctx) {
  const { rng, soak } = ctx;
  const what = rng.pick(['truncated', 'random-bytes', 'bad-utf8', 'wrong-type', 'overflow', 'deep-nesting']);
  let path;
  let body;
  let param;  // the error's expected param, where the server can name one
  let code;   // the error's expected code
  let name = what;
  if (what === 'truncated') {
    const chat = rng.chance(0.5);
    const full = JSON.stringify(generationBody(rng, chat));
    path = chat ? '/v1/chat/completions' : '/v1/completions';
    body = full.slice(0, rng.int(0, full.length - 1));  // a strict prefix of an object never parses
  } else if (what === 'random-bytes') {
    path = rng.pick(['/v1/chat/completions', '/v1/completions', '/tokenize', '/detokenize']);
    body = rng.bytes(rng.int(1, 256));
  } else if (what === 'bad-utf8') {
    const [n, bytes] = rng.pick(BAD_UTF8);
    name = `bad-utf8/${n}`;
    path = rng.pick(['/v1/chat/completions', '/tokenize']);
    body = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"a'), Buffer.from(bytes), Buffer.from('b"}]}')]);
  } else if (what === 'wrong-type') {
    const [n, p, b, expectParam] = rng.pick(WRONG_TYPES);
    name = `wrong-type/${n}`;
    path = p;
    body = typeof b === 'string' ? b : JSON.stringify(b);
    param = expectParam;
  } else if (what === 'overflow') {
    const [p, make] = rng.pick(OVERFLOW_FIELDS);
    path = p;
    body = make(rng.pick(['1e999', '-1e999', '1e400', '123456789e999']));
  } else {
    const [place, p, make] = rng.pick(DEEP_PLACES);
    const levels = rng.pick([129, 200, 20000, 100000]);
    const shape = rng.pick(['arrays', 'objects', 'unclosed']);
    name = `deep-nesting/${place}`;
    path = p;
    body = make(shape === 'arrays' ? deepArrays(levels) : shape === 'objects' ? deepObjects(levels) : '['.repeat(levels));
    // Refused by a scan before any parsing: even an unclosed one is "too deep", not "malformed".
    code = 'json_too_deep';
  }
  ctx.kind = `json:${name}`;
  const r = await soak.fetch(ctx, 'POST', path, body, [400]);
  if (param !== undefined) assert.equal(r.error.param, param, `the error's param: ${r.text}`);
  if (code !== undefined) assert.equal(r.error.code, code, `the error's code: ${r.text}`);
}

// A valid /tokenize body with a few bytes changed: a 200 or a 400, never anything else. (Only
// /tokenize: a mutated generation request could lose its max_tokens and run for seconds.)
async function mutatedTokenize(ctx) {
  const { rng, soak } = ctx;
  ctx.kind = 'json:mutated-tokenize';
  const body = Buffer.from(JSON.stringify({
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: rng.pick(PROMPTS) }],
    tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }],
    thinking: { type: 'enabled' },
  }));
  for (let i = rng.int(1, 3); i > 0; --i) body[rng.int(0, body.length - 1)] = rng.int(0, 255);
  await soak.fetch(ctx, 'POST', '/tokenize', body, [200, 400]);
}

// ------------------------------------------------------------------------------------------------
// Malformed HTTP on raw sockets: a 4xx (or 501) in OpenAI's shape with Connection: close, then the
// server closes; or, for a message the client cut short and half-closed, no answer and a close.

const BIG = 70 * 1024;  // over the 64 KiB header limit
const HTTP_CASES = [
  ['garbage-request-line', 400, (rng) => [Buffer.concat([rng.bytes(rng.int(1, 100), [0x0d, 0x0a]), Buffer.from('\r\nHost: x\r\n\r\n')])]],
  ['bare-lf', 400, () => ['GET /health HTTP/1.1\nHost: x\n\n']],
  ['http-0.9', 400, () => ['GET /health\r\n\r\n']],
  ['http2-preface', 400, () => ['PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n']],
  ['bad-version', 400, (rng) => [`GET /health HTTP/${rng.pick(['1.2', '3.0', '1.x', '11'])}\r\nHost: x\r\n\r\n`]],
  ['content-length-and-chunked', 400, () => ['POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n']],
  ['bad-content-length', 400, (rng) => [`POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: ${rng.pick(['abc', '-1', '1 2', '0x10', '+15', '99999999999999999999999', '15\r\nContent-Length: 16'])}\r\n\r\n{"prompt":"hi"}`]],
  ['te-xchunked', 400, () => ['POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n']],
  ['te-chunked-then-gzip', 400, () => ['POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n']],
  ['te-gzip-then-chunked', 501, () => ['POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n']],
  ['bad-chunk-size', 400, (rng) => [`POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n${rng.pick(['zz', '-1', 'ffffffffffffffffffff'])}\r\n{}\r\n0\r\n\r\n`]],
  ['bad-header-field', 400, (rng) => [`GET /health HTTP/1.1\r\nHost: x\r\n${rng.pick(['Host : x', 'No-Colon', 'X-A: a\0b', 'X(A): a'])}\r\n\r\n`]],
  ['duplicate-host', 400, () => ['GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n']],
  ['header-over-64k', 431, (rng) => [rng.pick([
    `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(BIG)}\r\n\r\n`,
    `GET /health HTTP/1.1\r\nHost: x\r\n${Array.from({ length: BIG / 32 }, (_, i) => `X-H${i}: ${'b'.repeat(24)}\r\n`).join('')}\r\n`,
    `GET /${'c'.repeat(BIG)} HTTP/1.1\r\nHost: x\r\n\r\n`,
  ])]],
  ['content-length-over-limit', 413, () => [`POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: ${MAX_BODY_BYTES + 1}\r\n\r\n{`]],
  // Cut short, then half-closed by the client: nobody is left to answer.
  ['body-shorter-than-content-length', null, (rng) => [`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n${'{"messages":[{"role"'.slice(0, rng.int(0, 20))}`]],
  ['header-cut-short', null, (rng) => ['POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n'.slice(0, rng.int(1, 60))]],
];

async function malformedHttp(ctx) {
  const { rng, soak } = ctx;
  const [name, status, make] = rng.pick(HTTP_CASES);
  ctx.kind = `http:${name}`;
  const parts = make(rng);
  ctx.request = `raw ${showBytes(Buffer.concat(parts.map((p) => Buffer.from(p))))}`;
  const x = await rawExchange(soak.port, parts, { halfClose: status === null });
  assert.ok(!x.timedOut, `no ${status ?? 'close'} within ${RAW_TIMEOUT_MS} ms (a hang); got ${showBytes(x.data)}`);
  if (status === null) {
    assert.equal(x.data.length, 0, `an answer to a request the client cut short: ${showBytes(x.data)}`);
    return;
  }
  const r = parseResponse(x.data);
  assert.ok(r, `no complete response before the close (${x.error?.code ?? 'closed'}): ${showBytes(x.data)}`);
  soak.observeRaw(ctx, r, [status]);
  assert.equal(r.headers.get('connection')?.toLowerCase(), 'close', 'no Connection: close on a refused request');
  assert.equal(x.data.length, r.end, `bytes after the response: ${showBytes(x.data.subarray(r.end))}`);
}

// ------------------------------------------------------------------------------------------------
// Aborted requests: the client goes away mid-flight. The server must cancel the work (checked at
// the end: nothing left running, the KV pages back) and answer everyone else.

// A request that would run long if nobody aborted it.
function longBody(rng, stream) {
  return { model: MODEL, messages: chatMessages(rng.pick(PROMPTS)), max_tokens: rng.int(64, 512), ignore_eos: true,
    stream, ...(rng.chance(0.3) ? { n: 2 } : {}) };
}

async function abortStreamAfterFirstChunk(ctx) {
  const { rng, soak } = ctx;
  ctx.kind = 'abort:stream-after-first-chunk';
  const body = JSON.stringify(longBody(rng, true));
  ctx.request = `POST /v1/chat/completions ${showBytes(body)}`;
  const ctrl = new AbortController();
  const limit = AbortSignal.timeout(REQUEST_TIMEOUT_MS);
  try {
    const r = await fetch(`${soak.srv.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body, signal: AbortSignal.any([ctrl.signal, limit]),
    });
    if (r.status !== 200) {
      soak.observe(ctx, { status: r.status, header: (n) => r.headers.get(n), text: decodeBody(Buffer.from(await r.arrayBuffer())) }, GENERATION_OK);
      return;
    }
    soak.observe(ctx, { status: 200, header: (n) => r.headers.get(n), text: '' }, [200]);
    const reader = r.body.getReader();
    const first = await reader.read();
    assert.ok(!first.done && first.value.length > 0, 'a stream that ended before its first chunk');
    ctrl.abort();
    reader.cancel().catch(() => {});
  } catch (e) {
    if (limit.aborted) throw new Error(`no first chunk within ${REQUEST_TIMEOUT_MS / 1000} s`);
    if (!ctrl.signal.aborted) throw e;
  }
}

// Streaming or not, aborted after a random short delay (possibly before the response starts,
// possibly after it finished: then the response is checked like any other).
async function abortAfterDelay(ctx) {
  const { rng, soak } = ctx;
  const stream = rng.chance(0.5);
  ctx.kind = `abort:${stream ? 'stream' : 'non-stream'}-after-delay`;
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), rng.int(0, 400));
  try {
    await soak.fetch(ctx, 'POST', '/v1/chat/completions', JSON.stringify(longBody(rng, stream)), GENERATION_OK,
      { signal: ctrl.signal });
  } catch (e) {
    if (!ctrl.signal.aborted) throw e;
  } finally {
    clearTimeout(timer);
  }
}

// On a raw socket: the connection is destroyed after the response header and its first bytes
// (streaming) or after a random delay (non-streaming), as a killed client would.
async function abortRaw(ctx) {
  const { rng, soak } = ctx;
  const stream = rng.chance(0.5);
  ctx.kind = `abort:raw-${stream ? 'stream-first-bytes' : 'non-stream-destroy'}`;
  const wire = httpRequest('POST', '/v1/chat/completions', JSON.stringify(longBody(rng, stream)));
  ctx.request = `raw ${showBytes(wire)}`;
  const firstBytes = (buf) => {
    if (afterResponses(1)(buf)) return true;
    const head = parseHead(buf);
    return head !== null && head.status === 200 && buf.length > head.bodyStart;
  };
  const x = await rawExchange(soak.port, [wire], stream
    ? { until: firstBytes, timeoutMs: REQUEST_TIMEOUT_MS }
    : { until: afterResponses(1), abortAfterMs: rng.int(5, 400), timeoutMs: REQUEST_TIMEOUT_MS });
  assert.ok(!x.timedOut, `no response within ${REQUEST_TIMEOUT_MS / 1000} s`);
  assert.ok(!x.closed, `the server closed the connection: ${showBytes(x.data)}`);
  const whole = parseResponse(x.data);
  if (whole) return soak.observeRaw(ctx, whole, GENERATION_OK);  // finished (or refused) before the abort
  const head = parseHead(x.data);
  if (head) soak.observe(ctx, { status: head.status, header: (n) => head.headers.get(n), text: '' }, [200]);
}

// ------------------------------------------------------------------------------------------------
// Slow clients

// A valid request written a few bytes at a time, all of it within ~1.5 s (inside the keep-alive
// timeout that bounds reading a header): answered normally.
async function dribble(ctx) {
  const { rng, soak } = ctx;
  ctx.kind = 'slow:dribble';
  const which = rng.pick(['health', 'tokenize', 'chat']);
  const wire = which === 'health' ? httpRequest('GET', '/health')
    : which === 'tokenize' ? httpRequest('POST', '/tokenize', JSON.stringify({ prompt: rng.pick(PROMPTS) }))
      : httpRequest('POST', '/v1/chat/completions', JSON.stringify({ messages: chatMessages(rng.pick(PROMPTS)), max_tokens: rng.int(1, 8) }));
  const parts = [];
  for (let i = 0; i < wire.length;) {
    const n = rng.int(1, 16);
    parts.push(wire.subarray(i, i + n));
    i += n;
  }
  const gapMs = Math.min(rng.int(2, 40), Math.floor(1500 / parts.length));
  ctx.request = `raw, ${parts.length} writes ${gapMs} ms apart: ${showBytes(wire)}`;
  const x = await rawExchange(soak.port, parts, { gapMs, until: afterResponses(1), timeoutMs: REQUEST_TIMEOUT_MS });
  assert.ok(!x.timedOut, `no response within ${REQUEST_TIMEOUT_MS / 1000} s`);
  const r = parseResponse(x.data);
  assert.ok(r, `no complete response (${x.error?.code ?? 'closed'}): ${showBytes(x.data)}`);
  soak.observeRaw(ctx, r, which === 'chat' ? GENERATION_OK : [200]);
  assert.equal(x.data.length, r.end, `bytes after the response: ${showBytes(x.data.subarray(r.end))}`);
  if (r.status === 200) assert.equal(r.headers.get('connection'), 'keep-alive');
}

// A connection that sends nothing, or a header it never finishes: the server closes it once the
// keep-alive timeout passes, without a word; or the client gives up first. These run in the
// background (the worker does not wait), so they overlap with all the other traffic.
async function idleConnection(ctx) {
  const { rng, soak } = ctx;
  const stall = rng.chance(0.5);
  const clientGivesUp = rng.chance(0.5);
  ctx.kind = `slow:${stall ? 'stalled-header' : 'idle'}-${clientGivesUp ? 'client-closes' : 'server-closes'}`;
  const parts = stall ? ['POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le'.slice(0, rng.int(1, 50))] : [];
  ctx.request = `raw ${showBytes(parts.join(''))} then nothing`;
  const timeoutMs = KEEP_ALIVE_S * 1000 + 3000;
  const x = await rawExchange(soak.port, parts, clientGivesUp ? { abortAfterMs: rng.int(0, 1000), timeoutMs } : { timeoutMs });
  assert.ok(!x.timedOut, `the server kept an idle connection past ${timeoutMs} ms`);
  assert.equal(x.data.length, 0, `an answer on an idle connection: ${showBytes(x.data)}`);
}

// ------------------------------------------------------------------------------------------------
// The soak

// What a worker picks from, in proportion to the weights.
const ACTIONS = [
  { weight: 7, run: (ctx) => validGeneration(ctx, true, false) },
  { weight: 7, run: (ctx) => validGeneration(ctx, true, true) },
  { weight: 4, run: (ctx) => validGeneration(ctx, false, false) },
  { weight: 4, run: (ctx) => validGeneration(ctx, false, true) },
  { weight: 2, kind: 'valid:models', run: validModels },
  { weight: 2, kind: 'valid:health', run: validHealth },
  { weight: 1, kind: 'valid:metrics', run: validMetrics },
  { weight: 3, kind: 'valid:tokenize+detokenize', run: validTokenize },
  { weight: 3, run: routeErrors },
  { weight: 2, kind: 'valid:pipelined', run: pipelined },
  { weight: 16, run: malformedJson },
  { weight: 2, run: mutatedTokenize },
  { weight: 18, run: malformedHttp },
  { weight: 3, run: abortStreamAfterFirstChunk },
  { weight: 3, run: abortAfterDelay },
  { weight: 3, run: abortRaw },
  { weight: 3, run: dribble },
  { weight: 2, background: true, run: idleConnection },
];

async function runAction(soak, action, ctx) {
  soak.inFlight.add(ctx);
  soak.recent.push(ctx);
  if (soak.recent.length > 12) soak.recent.shift();
  try {
    await action.run(ctx);
  } catch (e) {
    soak.fail(ctx, e);
  } finally {
    soak.inFlight.delete(ctx);
    soak.count(ctx.kind);
  }
}

async function worker(soak, index, deadline) {
  const picker = makeRng(mixSeed(soak.seed, index));
  for (let step = 0; Date.now() < deadline && !soak.stopped; ++step) {
    // The server must still be there before every action (a crash also stops the soak at once).
    if (soak.srv.proc.exitCode !== null) break;
    let action = picker.weighted(ACTIONS);
    if (action.background && soak.background.size >= MAX_BACKGROUND) action = ACTIONS[0];
    // Each action has its own generator: what it sends depends on (seed, worker, step) only.
    const ctx = { soak, rng: makeRng(mixSeed(soak.seed, index, step + 1)), worker: index, step,
      kind: action.kind ?? 'unnamed', request: '' };
    const done = runAction(soak, action, ctx);
    if (action.background) {
      soak.background.add(done);
      done.then(() => soak.background.delete(done));
    } else {
      await done;
    }
  }
}

function summary(soak, seconds) {
  const lines = [`soak: seed ${soak.seed} (M3_SOAK_SEED=${soak.seed} replays it), ${seconds.toFixed(1)} s, ${WORKERS} workers`];
  const byCategory = new Map();
  for (const [kind, n] of [...soak.kinds].sort()) {
    const [cat, name] = kind.split(':');
    if (!byCategory.has(cat)) byCategory.set(cat, []);
    byCategory.get(cat).push([name, n]);
  }
  const total = [...soak.kinds.values()].reduce((a, b) => a + b, 0);
  lines.push(`soak: ${total} actions`);
  for (const [cat, entries] of byCategory) {
    const sum = entries.reduce((a, [, n]) => a + n, 0);
    lines.push(`  ${cat.padEnd(6)} ${String(sum).padStart(6)}: ${entries.map(([name, n]) => `${name} ${n}`).join(', ')}`);
  }
  const statuses = [...soak.statuses].sort(([a], [b]) => a - b).map(([s, n]) => `${s}: ${n}`).join(', ');
  lines.push(`soak: statuses ${statuses}`);
  lines.push(`soak: ${soak.failures.length} failures`);
  for (const f of soak.failures.slice(0, 30)) lines.push(`  FAIL ${f.where}: ${f.message}\n       request: ${f.request}`);
  if (soak.failures.length > 30) lines.push(`  … and ${soak.failures.length - 30} more`);
  return lines.join('\n');
}

test(`soak: ${WORKERS} workers of valid, malformed, aborted and slow requests for ${SOAK_SECONDS} s`,
  { timeout: (SOAK_SECONDS + 80) * 1000 }, async () => {
    const srv = await startServer(['--max-running-requests', String(MAX_RUNNING),
      '--max-queued-requests', String(MAX_QUEUED), '--max-request-body-bytes', String(MAX_BODY_BYTES)]);
    const soak = new Soak(srv, SEED);
    let exitCode;
    try {
      // A crash stops the soak and names the requests that were in flight when it happened.
      // The request that killed it may have ended already (its socket reset before node saw the
      // exit), so the last ones started are listed as well.
      let crashed = null;
      srv.exited.then(({ code, signal }) => {
        if (soak.stopped) return;
        const show = (c) => `  worker ${c.worker} step ${c.step} (${c.kind}): ${c.request}`;
        crashed = `the server exited (code ${code}, signal ${signal}) during the soak; in flight:\n` +
          `${[...soak.inFlight].map(show).join('\n')}\nthe last started:\n${soak.recent.map(show).join('\n')}\n` +
          `its log:\n${srv.log().slice(-3000)}`;
        soak.stopped = true;
      });

      // The baseline, after one request has warmed the engine up.
      const warm = await fetch(`${srv.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, messages: chatMessages(), max_tokens: 4 }) });
      assert.equal(warm.status, 200, await warm.text());
      assert.ok(await waitFor(async () => (await metricValue(srv, 'm3serve:num_requests_running')) === 0));
      const baselinePages = await metricValue(srv, 'm3serve:kv_pages_used');

      console.log(`soak: seed ${SEED} (set M3_SOAK_SEED=${SEED} to replay), ${SOAK_SECONDS} s, ${WORKERS} workers`);
      const t0 = Date.now();
      const deadline = t0 + SOAK_SECONDS * 1000;
      await Promise.all(Array.from({ length: WORKERS }, (_, i) => worker(soak, i, deadline)));
      await Promise.all([...soak.background]);  // each bounded by its own timeout
      const seconds = (Date.now() - t0) / 1000;
      const wasCrashed = crashed;
      soak.stopped = true;
      console.log(summary(soak, seconds));

      if (wasCrashed) assert.fail(wasCrashed);
      assert.equal(srv.proc.exitCode, null, `the server exited:\n${srv.log().slice(-4000)}`);
      if (soak.failures.length > 0) {
        assert.fail(`${soak.failures.length} failures (seed ${SEED}), the first:\n` +
          soak.failures.slice(0, 5).map((f) => `${f.where}: ${f.message}\n  request: ${f.request}`).join('\n'));
      }

      // Back to idle: nothing running or waiting, the KV pages of before, and healthy.
      const gauges = async () => ({
        running: await metricValue(srv, 'm3serve:num_requests_running'),
        waiting: await metricValue(srv, 'm3serve:num_requests_waiting'),
        kvPagesUsed: await metricValue(srv, 'm3serve:kv_pages_used'),
      });
      let last;
      const idle = await waitFor(async () => {
        last = await gauges();
        return last.running === 0 && last.waiting === 0 && last.kvPagesUsed === baselinePages;
      }, 15000, 100);
      assert.ok(idle, `not idle 15 s after the soak: ${JSON.stringify(last)}, KV pages before ${baselinePages}`);
      assert.equal((await fetch(`${srv.url}/health`)).status, 200);
      console.log(`soak: idle again (${JSON.stringify(last)}); http_connections_open ${await metricValue(srv, 'm3serve:http_connections_open')}`);
      assert.equal(srv.proc.exitCode, null, `the server exited:\n${srv.log().slice(-4000)}`);
    } finally {
      soak.stopped = true;
      exitCode = await stopServer(srv);
    }
    assert.equal(exitCode, 0, srv.log().slice(-4000));
  });
