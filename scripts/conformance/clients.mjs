// clients.mjs drives a running bridge with real MCP clients the project
// did not write: the TypeScript SDK v1 (@modelcontextprotocol/sdk) and the
// v2 client (@modelcontextprotocol/client) in both eras (2025-11-25 with
// initialize and a session, 2026-07-28 stateless after server/discover).
// Versions are pinned in package.json / package-lock.json here;
// scripts/conformance.sh installs them and runs this against a bridge
// serving two boards of configs/profiles/conformance.yaml (aliases test
// and json).
//
//	node clients.mjs URL              run every check with every client
//	node clients.mjs URL --wait A,B   wait (30 s at most) until tools A and B are listed, then exit
//
// To add a check (resources, completion, logging, tasks, ...), write an
// async function (client, ctx) that throws an Error saying what is wrong,
// and add it to `checks` below. ctx.name is the client's name and ctx.era
// "2025-11-25" or "2026-07-28"; both SDK generations have the same Client
// methods (listTools, callTool, listResources, readResource, complete,
// setLoggingLevel, ...). A check that does not apply to a client or an
// era returns "skip: why".

import { Client as V1Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport as V1Transport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { Client as V2Client, StreamableHTTPClientTransport as V2Transport } from '@modelcontextprotocol/client';

const LEGACY = '2025-11-25';
const MODERN = '2026-07-28';

// The fixtures' answers, as configs/profiles/conformance.yaml gives them.
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC';
const WAV = 'UklGRiwAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQgAAACAgICAgICAgA==';

// ---- clients ---------------------------------------------------------------

const info = { name: 'devicebridge-conformance-clients', version: '1' };

/**
 * The user behind every client's elicitation handler: a check sets
 * user.answers (accepted as the form's content; null declines) and reads
 * the requests back from user.asked.
 */
const user = { answers: null, asked: [] };
function elicit(params) {
  user.asked.push(params);
  return user.answers ? { action: 'accept', content: user.answers } : { action: 'decline' };
}

/** Each client: a name, its era, and how to connect it to url. */
const clients = [
  {
    name: 'ts-sdk-v1',
    era: LEGACY,
    connect: async (url) => {
      const c = new V1Client(info, { capabilities: { elicitation: {} } });
      c.setRequestHandler(ElicitRequestSchema, async (req) => elicit(req.params));
      await c.connect(new V1Transport(new URL(url)));
      return c;
    },
  },
  {
    name: 'ts-client-v2-legacy',
    era: LEGACY,
    connect: async (url) => {
      const c = new V2Client(info, { capabilities: { elicitation: {} }, versionNegotiation: { mode: 'legacy' } });
      c.setRequestHandler('elicitation/create', async (req) => elicit(req.params));
      await c.connect(new V2Transport(new URL(url)));
      return c;
    },
  },
  {
    name: 'ts-client-v2-modern',
    era: MODERN,
    connect: async (url) => {
      const c = new V2Client(info, { capabilities: { elicitation: {} }, versionNegotiation: { mode: { pin: MODERN } } });
      // In 2026-07-28 the questions come as input_required results, which
      // the v2 client answers through the same handler.
      c.setRequestHandler('elicitation/create', async (req) => elicit(req.params));
      await c.connect(new V2Transport(new URL(url)));
      if (c.getProtocolEra() !== 'modern') throw new Error(`negotiated era ${c.getProtocolEra()}, want modern`);
      return c;
    },
  },
];

// ---- helpers ---------------------------------------------------------------

function fail(msg) {
  throw new Error(msg);
}

/** JSON with object keys sorted, so that key order does not matter. */
function canonical(v) {
  return JSON.stringify(v, (_, x) =>
    x && typeof x === 'object' && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : 1))) : x);
}

function expectEqual(what, got, want) {
  const g = canonical(got);
  const w = canonical(want);
  if (g !== w) fail(`${what}: got ${g}, want ${w}`);
}

/** Every tool, over all pages. */
async function allTools(client) {
  const tools = [];
  let cursor;
  for (let page = 0; page < 100; page++) {
    const res = await client.listTools(cursor ? { cursor } : undefined);
    tools.push(...res.tools);
    cursor = res.nextCursor;
    if (!cursor) return tools;
  }
  fail('tools/list did not end within 100 pages');
}

// ---- checks ----------------------------------------------------------------

/** tools: list, call, and read each kind of content back as the board sent it. */
async function tools(client) {
  const listed = new Map((await allTools(client)).map((t) => [t.name, t]));
  for (const name of ['test_simple_text', 'test_image_content', 'test_audio_content', 'test_multiple_content_types',
    'test_error_handling', 'json_schema_2020_12_tool']) {
    if (!listed.has(name)) fail(`tools/list lacks ${name} (${listed.size} tools listed)`);
  }
  expectEqual('json_schema_2020_12_tool $schema', listed.get('json_schema_2020_12_tool').inputSchema.$schema,
    'https://json-schema.org/draft/2020-12/schema');

  let res = await client.callTool({ name: 'test_simple_text', arguments: {} });
  expectEqual('test_simple_text content', res.content, [{ type: 'text', text: 'This is a simple text response for testing.' }]);

  res = await client.callTool({ name: 'test_image_content', arguments: {} });
  expectEqual('test_image_content content', res.content, [{ type: 'image', mimeType: 'image/png', data: PNG }]);

  res = await client.callTool({ name: 'test_audio_content', arguments: {} });
  expectEqual('test_audio_content content', res.content, [{ type: 'audio', mimeType: 'audio/wav', data: WAV }]);

  res = await client.callTool({ name: 'test_multiple_content_types', arguments: {} });
  expectEqual('test_multiple_content_types types', res.content.map((c) => c.type), ['text', 'image', 'resource']);
  expectEqual('test_multiple_content_types resource', res.content[2].resource,
    { uri: 'test://mixed-content-resource', mimeType: 'application/json', text: '{"test":"data","value":123}' });

  res = await client.callTool({ name: 'test_error_handling', arguments: {} });
  expectEqual('test_error_handling isError', res.isError, true);
  expectEqual('test_error_handling text', res.content[0]?.text, 'This tool intentionally returns an error for testing');
}

/**
 * elicitation: a call missing required arguments is completed by asking
 * the user (elicitation/create, or input_required rounds in 2026-07-28),
 * and the answers reach the board (the fixture echoes its arguments).
 */
async function elicitation(client) {
  user.asked = [];
  user.answers = { username: 'ada', email: 'ada@example.com' };
  try {
    const res = await client.callTool({ name: 'test_elicitation', arguments: { message: 'hello' } });
    expectEqual('questions asked', user.asked.length, 1);
    expectEqual('fields asked', Object.keys(user.asked[0].requestedSchema.properties).sort(), ['email', 'username']);
    expectEqual('test_elicitation result', res.structuredContent, { message: 'hello', username: 'ada', email: 'ada@example.com' });
  } finally {
    user.answers = null;
  }
}

// Each check is [name, function]. Add new ones here.
const checks = [
  ['tools', tools],
  ['elicitation', elicitation],
];

// ---- runner ----------------------------------------------------------------

async function waitFor(url, names) {
  const deadline = Date.now() + 30_000;
  let last = 'not tried';
  while (Date.now() < deadline) {
    try {
      const c = await clients[0].connect(url);
      try {
        const listed = new Set((await allTools(c)).map((t) => t.name));
        const missing = names.filter((n) => !listed.has(n));
        if (missing.length === 0) return;
        last = `missing ${missing.join(', ')}`;
      } finally {
        await c.close();
      }
    } catch (e) {
      last = e.message;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  fail(`the bridge at ${url} did not list ${names.join(', ')} within 30 s (${last})`);
}

async function main() {
  const [url, flag, arg] = process.argv.slice(2);
  if (!url) fail('usage: node clients.mjs URL [--wait tool,tool]');
  if (flag === '--wait') {
    await waitFor(url, arg.split(','));
    return 0;
  }
  let failed = 0;
  for (const spec of clients) {
    let client;
    try {
      client = await spec.connect(url);
    } catch (e) {
      console.log(`FAIL ${spec.name} connect: ${e.message}`);
      failed++;
      continue;
    }
    for (const [name, check] of checks) {
      try {
        const out = await check(client, { name: spec.name, era: spec.era, url });
        console.log(typeof out === 'string' && out.startsWith('skip') ? `skip ${spec.name} ${name}: ${out}` : `ok   ${spec.name} ${name}`);
      } catch (e) {
        console.log(`FAIL ${spec.name} ${name}: ${e.message}`);
        failed++;
      }
    }
    await client.close();
  }
  return failed === 0 ? 0 : 1;
}

main().then((code) => process.exit(code), (e) => {
  console.error(`clients.mjs: ${e.message}`);
  process.exit(2);
});
