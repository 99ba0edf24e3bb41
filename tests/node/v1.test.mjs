// The OpenAI-compatible API (/v1) through the official `openai` npm package, against a gateway
// this file starts (the binary at AGENT_GATEWAY_BIN) with a scripted provider.
// Run: AGENT_GATEWAY_BIN=target/debug/agent-gateway node --test tests/node/

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, openSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = process.env.AGENT_GATEWAY_BIN || join(ROOT, 'target', 'debug', 'agent-gateway');
const TOKEN = 'node-rpc-secret-0123456789abcdefghijklmnopqrstuv';
const MODEL = 'script/m1';
const REPLY = 'Hello there, friend.';
const HELLO = [{ role: 'user', content: 'hello' }];

let proc;
let dir;
let base;

function freePort() {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.once('error', fail);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
  });
}

async function waitHealthy(url, ms) {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      const r = await fetch(`${url}/health`);
      if (r.ok) return;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline || proc.exitCode !== null) {
      throw new Error(`gateway did not start:\n${readFileSync(join(dir, 'gateway.log'), 'utf8')}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

function client(apiKey = TOKEN) {
  return new OpenAI({ apiKey, baseURL: `${base}/v1`, maxRetries: 0, timeout: 30_000 });
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'agw-node-'));
  const port = await freePort();
  const config = [
    'gateway:',
    '  host: 127.0.0.1',
    `  port: ${port}`,
    `  dataDir: ${join(dir, 'data')}`,
    '  rateLimit: {windowMs: 60000, maxRequests: 100000}',
    '  tokens:',
    `    - {id: client, secret: ${TOKEN}, scopes: [rpc]}`,
    'local: {autoFetch: false, preload: false}',
    'providers:',
    '  script:',
    '    type: scripted',
    '    models: [m1]',
    '    script:',
    '      - match: "hello"',
    '        steps:',
    `          - reply: "${REPLY}"`,
    '            usage: {input: 10, output: 5}',
    'agents:',
    '  default: {model: script/m1}',
    '',
  ].join('\n');
  writeFileSync(join(dir, 'gateway.yaml'), config);
  const log = openSync(join(dir, 'gateway.log'), 'w');
  proc = spawn(BIN, ['serve', '--config', join(dir, 'gateway.yaml')], { stdio: ['ignore', log, log] });
  base = `http://127.0.0.1:${port}`;
  await waitHealthy(base, 20_000);
});

after(async () => {
  if (proc && proc.exitCode === null) {
    const exited = new Promise((r) => proc.once('exit', r));
    proc.kill('SIGTERM');
    const timer = setTimeout(() => proc.kill('SIGKILL'), 15_000);
    await exited;
    clearTimeout(timer);
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test('models.list lists <provider>/<model> ids', async () => {
  const ids = [];
  for await (const m of client().models.list()) {
    assert.equal(m.object, 'model');
    assert.ok(m.id.includes('/'), m.id);
    ids.push(m.id);
  }
  assert.ok(ids.includes(MODEL), JSON.stringify(ids));
});

test('chat.completions.create, non-streaming', async () => {
  const c = await client().chat.completions.create({ model: MODEL, messages: HELLO });
  assert.match(c.id, /^chatcmpl-/);
  assert.equal(c.object, 'chat.completion');
  assert.equal(c.model, MODEL);
  assert.equal(c.choices.length, 1);
  assert.equal(c.choices[0].message.role, 'assistant');
  assert.equal(c.choices[0].message.content, REPLY);
  assert.equal(c.choices[0].finish_reason, 'stop');
  assert.deepEqual(c.usage, { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 });
});

test('chat.completions.create, streaming with include_usage', async () => {
  const stream = await client().chat.completions.create({
    model: MODEL,
    messages: HELLO,
    stream: true,
    stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.ok(chunks.length >= 4, `${chunks.length} chunks`);
  assert.equal(new Set(chunks.map((c) => c.id)).size, 1);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const text = chunks
    .filter((c) => c.choices.length > 0)
    .map((c) => c.choices[0].delta.content ?? '')
    .join('');
  assert.equal(text, REPLY);
  const finish = chunks.filter((c) => c.choices.length > 0 && c.choices[0].finish_reason !== null);
  assert.equal(finish.length, 1);
  assert.equal(finish[0].choices[0].finish_reason, 'stop');
  const last = chunks[chunks.length - 1];
  assert.deepEqual(last.choices, []);
  assert.deepEqual(last.usage, { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 });
  assert.ok(chunks.slice(0, -1).every((c) => c.usage == null));
});

test('chat.completions.create, streaming without include_usage has no usage chunk', async () => {
  const stream = await client().chat.completions.create({ model: MODEL, messages: HELLO, stream: true });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.ok(chunks.every((c) => c.choices.length === 1 && c.usage == null));
  assert.equal(chunks.map((c) => c.choices[0].delta.content ?? '').join(''), REPLY);
});

test('errors surface as the SDK error classes', async () => {
  await assert.rejects(
    client().chat.completions.create({ model: 'nope/never', messages: HELLO }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.message.includes('Model not found: nope/never'),
  );
  await assert.rejects(
    client('not-a-real-token-0123456789abcdefghijklmnop').models.list(),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401,
  );
  await assert.rejects(
    client().chat.completions.create({ model: MODEL, messages: HELLO, temperature: 2.5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.error?.type === 'invalid_request_error',
  );
});
