// devicebridge web console. Plain JavaScript, no library: the fleet from
// /api/devices kept live by /api/events, a board page whose forms come from
// each tool's input schema, guided calls through /api/interactions, an event
// log that opens with the bridge's recent history (/api/events?history=N),
// plots of the last 15 minutes of calls (/api/stats/recent) and the OTA
// boards waiting for approval (/api/ota/devices).
//
// Everything a board sends (names, descriptions, results) is untrusted and
// is only ever put into the page as text (textContent), never as HTML. Nor
// does a board's text ever become a name or id in the page, or a key of a
// plain object: a form control named "addEventListener" would replace the
// form's own method (DOM clobbering), and an argument named "__proto__"
// would set an object's prototype instead of a property. Inputs are kept
// by reference and marked with data-arg; board-keyed objects have no
// prototype. Values from a board's schema may be of any JSON type (an
// object whose "toString" is data, say): they become text through str.
'use strict';

const state = {
  boards: new Map(), // device_id -> board (summary, plus closed ones we saw leave)
  token: sessionStorage.getItem('devicebridge-token') || '',
  locked: false,     // the bridge wants a token we do not have (yet)
  loaded: false,     // the board list was read at least once
  detail: null,      // the board shown on the board page
  ota: true,         // false once the bridge says it serves no OTA approvals
};

// HISTORY is how many past events a new page asks for.
const HISTORY = 200;

const $ = (id) => document.getElementById(id);

// str turns any JSON value into text without calling a method of it.
function str(v) {
  if (typeof v === 'string') return v;
  if (v === undefined) return '';
  return JSON.stringify(v);
}

// sentence ends a message with a full stop when it has none, so an error
// and its suggestion read as two sentences.
function sentence(s) { return /[.!?]$/.test(s) ? s : s + '.'; }

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = str(v);
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : str(v));
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : str(c));
  return e;
}

// --- HTTP with the control token ------------------------------------------

class HTTPError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || ('HTTP ' + status));
    this.status = status;
    this.body = body;
  }
}

async function api(method, path, body) {
  const headers = {};
  if (state.token) headers.Authorization = 'Bearer ' + state.token;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (resp.status === 401) needToken();
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = text; }
  if (!resp.ok) throw new HTTPError(resp.status, data);
  return data;
}

function needToken(msg) {
  setLocked(true);
  $('login').hidden = false;
  $('login-error').textContent = msg || (state.token ? 'That token was refused.' : '');
  $('token').focus();
}

$('login').addEventListener('submit', (ev) => {
  ev.preventDefault();
  state.token = $('token').value.trim();
  sessionStorage.setItem('devicebridge-token', state.token);
  $('login').hidden = true;
  restartEvents();
  route();
});

// setLocked shows the page as a bridge that wants a token: no fleet, no
// plots, no events, and a fleet table that says why it is empty.
function setLocked(on) {
  if (state.locked === on) return;
  state.locked = on;
  document.body.classList.toggle('locked', on);
  renderFleet();
  if (!on) refreshSide();
}

// --- the event stream -------------------------------------------------------
// EventSource cannot send a bearer token, so the stream is read with fetch.

let events = null; // AbortController of the open stream

function restartEvents() {
  if (events) events.abort();
  events = new AbortController();
  streamEvents(events.signal);
}

async function streamEvents(signal) {
  let delay = 500;
  let lastId = ''; // resumed from on reconnect: the bridge replays what we missed, or sends resync
  while (!signal.aborted) {
    try {
      const headers = { Accept: 'text/event-stream' };
      if (state.token) headers.Authorization = 'Bearer ' + state.token;
      if (lastId) headers['Last-Event-ID'] = lastId;
      // A fresh stream opens with the recent past: events up to the
      // header's id happened before it opened, and only go to the log.
      const resp = await fetch(lastId ? '/api/events' : '/api/events?history=' + HISTORY, { headers, signal });
      if (resp.status === 401) { setLive(false, 'token needed'); needToken(); return; }
      if (!resp.ok || !resp.body) throw new Error('HTTP ' + resp.status);
      const until = lastId ? 0 : seqOf(resp.headers.get('Devicebridge-History-Until'));
      if (!lastId) $('events').replaceChildren();
      setLive(true);
      setLocked(false);
      delay = 500;
      await loadFleet(); // after the stream opened: nothing is missed
      const reader = resp.body.getReader();
      const dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const frame = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let type = 'message', data = '';
          for (const line of frame.split('\n')) {
            if (line.startsWith('id: ')) lastId = line.slice(4);
            else if (line.startsWith('event: ')) type = line.slice(7);
            else if (line.startsWith('data: ')) data += line.slice(6);
          }
          if (!data) continue;
          if (seqOf(lastId) <= until) onHistory(type, JSON.parse(data));
          else onEvent(type, JSON.parse(data));
        }
      }
    } catch (err) {
      if (signal.aborted) return;
    }
    setLive(false, 'reconnecting…');
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 10000);
  }
}

// seqOf is the number at the end of an event id ("<epoch>-<seq>").
function seqOf(id) {
  const m = /-(\d+)$/.exec(id || '');
  return m ? Number(m[1]) : 0;
}

function setLive(on, text) {
  const l = $('live');
  l.className = 'live ' + (on ? 'on' : 'off');
  l.textContent = on ? 'live' : text || 'offline';
}

function onEvent(type, data) {
  switch (type) {
    case 'online':
    case 'tools_changed':
      state.boards.set(data.device_id, data);
      logEvent(type, boardText(type, data), false, data.at);
      break;
    case 'offline':
      state.boards.set(data.device_id, Object.assign({}, data, { state: 'closed' }));
      logEvent(type, boardText(type, data), true, data.at);
      break;
    case 'call':
      logEvent(type, callText(data), data.code !== 'ok', data.at);
      soonStats();
      break;
    case 'resync':
      loadFleet();
      return;
    default:
      return;
  }
  renderFleet();
  if (state.detail && state.detail.device_id === data.device_id && type !== 'call') refreshBoard(type);
}

// onHistory logs an event from before the page opened. The fleet comes
// from GET /api/devices, so past events change no board.
function onHistory(type, data) {
  switch (type) {
    case 'online':
    case 'tools_changed':
    case 'offline':
      logEvent(type, boardText(type, data), type === 'offline', data.at, true);
      break;
    case 'call':
      logEvent(type, callText(data), data.code !== 'ok', data.at, true);
      break;
  }
}

function boardText(type, data) {
  const name = data.device_id + (data.alias ? ' (' + data.alias + ')' : '');
  if (type === 'offline') return name + ': ' + (data.close_reason || 'gone');
  return name + (data.tool_count ? ', ' + data.tool_count + ' tools,' : '') + ' ' + data.state;
}

function callText(data) {
  return data.device_id + ' ' + data.tool + ' → ' + data.code + ' in ' + fmtMS(data.duration_ms);
}

// logEvent adds a line on top of the log; at is when it happened (the
// event's time, else now); past marks an event from before the page.
function logEvent(type, text, bad, at, past) {
  const list = $('events');
  const t = at ? new Date(at) : new Date();
  list.prepend(el('li', { class: (bad ? 'bad' : '') + (past ? ' past' : ''), 'data-type': type },
    el('span', { class: 't', text: t.toLocaleTimeString(), title: t.toLocaleString() }), type + ' ' + text));
  while (list.children.length > HISTORY + 100) list.lastChild.remove();
}

// --- the recent past: calls over the last 15 minutes -------------------------
// The bridge keeps them (GET /api/stats/recent), so a page opened now shows
// the minutes before it too. Read every few seconds, and soon after a call.

let statsTimer = 0;

function soonStats() {
  if (!statsTimer) statsTimer = setTimeout(() => { statsTimer = 0; loadStats(); }, 300);
}

async function loadStats() {
  if (state.locked) return;
  let st;
  try {
    st = await api('GET', '/api/stats/recent');
  } catch (err) {
    return; // 401 asks for a token; anything else: the next round retries
  }
  const m = st.last_minute || {};
  $('m-rate').textContent = m.calls ? m.rate_per_s.toFixed(2) : '0';
  $('m-errors').textContent = String(m.errors || 0);
  $('m-p50').textContent = m.p50_ms === undefined ? '–' : fmtMS(m.p50_ms);
  $('m-p99').textContent = m.p99_ms === undefined ? '–' : fmtMS(m.p99_ms);
  renderPlots(st);
}

function fmtMS(ms) {
  if (ms >= 1000) return (ms / 1000).toFixed(2) + ' s';
  if (ms < 0.1) return '< 0.1 ms';
  return (ms >= 10 ? ms.toFixed(0) : ms.toFixed(1)) + ' ms';
}

const SVG = 'http://www.w3.org/2000/svg';

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

// renderPlots draws three small plots, one bar or point per interval:
// calls per second (failed ones in red), the share of calls that failed,
// and p50/p99 latency. Scales start at zero; the caption gives the top.
function renderPlots(st) {
  const ivs = Array.isArray(st.intervals) ? st.intervals : [];
  const n = Math.max(ivs.length, 1), W = 300, H = 60, bw = W / n;
  const secs = st.interval_s || 10;
  const minutes = Math.round((st.window_s || n * secs) / 60);
  document.querySelectorAll('.plot [data-from]').forEach((s) => { s.textContent = '−' + minutes + ' min'; });
  const total = ivs.reduce((a, iv) => a + (iv.calls || 0), 0);

  const plot = (name, children, scale) => {
    const fig = document.querySelector('.plot[data-plot="' + name + '"]');
    const svg = fig.querySelector('svg');
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.replaceChildren(svgEl('line', { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: 'base' }), ...children);
    fig.querySelector('.scale').textContent = total ? scale : 'no calls in ' + minutes + ' min';
    fig.dataset.calls = String(total);
  };
  const bars = (values, cls, top) => values.flatMap((v, i) => v > 0 ? [svgEl('rect', {
    class: 'bar ' + cls, x: i * bw + 0.5, width: Math.max(bw - 1, 0.5), y: H - Math.max(1, v / top * (H - 4)), height: Math.max(1, v / top * (H - 4)),
  })] : []);

  const rate = ivs.map((iv) => (iv.calls || 0) / secs);
  const topRate = Math.max(...rate, 0);
  plot('rate', [...bars(rate, 'ok', topRate), ...bars(ivs.map((iv) => (iv.errors || 0) / secs), 'bad', topRate)],
    'peak ' + topRate.toFixed(topRate < 1 ? 2 : 1) + '/s');

  const share = ivs.map((iv) => iv.calls ? iv.errors / iv.calls : 0);
  const failed = ivs.reduce((a, iv) => a + (iv.errors || 0), 0);
  plot('errors', bars(share, 'bad', 1), failed + ' of ' + total + ', peak ' + Math.round(100 * Math.max(...share, 0)) + ' %');

  const topMS = Math.max(...ivs.map((iv) => iv.p99_ms || 0), 0.001);
  const line = (key, cls) => {
    const pts = ivs.map((iv, i) => iv[key] === undefined ? null : [i * bw + bw / 2, H - 2 - iv[key] / topMS * (H - 6)]);
    const out = [];
    let run = [];
    for (const p of [...pts, null]) {
      if (p) { run.push(p); continue; }
      if (run.length > 1) out.push(svgEl('polyline', { class: 'line ' + cls, points: run.map((q) => q.join(',')).join(' ') }));
      if (run.length === 1) out.push(svgEl('rect', { class: 'dot ' + cls, x: run[0][0] - 1.5, y: run[0][1] - 1.5, width: 3, height: 3 }));
      run = [];
    }
    return out;
  };
  plot('latency', [...line('p99_ms', 'p99'), ...line('p50_ms', 'p50')], 'top ' + fmtMS(topMS));
}

// --- the fleet ----------------------------------------------------------------

async function loadFleet() {
  try {
    const data = await api('GET', '/api/devices');
    state.node = data.node || '';
    const seen = new Set();
    for (const d of data.devices) { state.boards.set(d.device_id, d); seen.add(d.device_id); }
    for (const [id, b] of state.boards) if (!seen.has(id) && b.state !== 'closed') state.boards.set(id, Object.assign({}, b, { state: 'closed' }));
    state.loaded = true;
    renderFleet();
  } catch (err) {
    if (err.status !== 401) logEvent('error', 'GET /api/devices: ' + err.message, true);
  }
}

const STATES = ['ready', 'initializing', 'connected', 'closed'];

function lastSeen(b) {
  if (b.state !== 'closed') return 'now';
  const t = b.closed_at ? new Date(b.closed_at) : null;
  return t ? t.toLocaleTimeString() : '–';
}

function renderFleet() {
  const filter = $('filter').value.trim().toLowerCase();
  const want = $('state-filter').value;
  const all = [...state.boards.values()].sort((a, b) => a.device_id.localeCompare(b.device_id));
  const counts = $('counts');
  counts.replaceChildren(el('button', { class: 'count' + (want === '' ? ' active' : ''), type: 'button', 'data-state': '',
    onclick: () => { $('state-filter').value = ''; renderFleet(); } }, el('b', { text: String(all.length) }), 'boards'));
  for (const s of STATES) {
    const n = all.filter((b) => b.state === s).length;
    counts.append(el('button', { class: 'count' + (want === s ? ' active' : ''), type: 'button', 'data-state': s,
      onclick: () => { $('state-filter').value = want === s ? '' : s; renderFleet(); } }, el('b', { text: String(n) }), s));
  }
  // In a fleet of bridges (docs/scaling.md) boards held by another node name
  // it, and the bridge names its own node; only then is there a node column.
  const fleet = !!state.node || all.some((b) => b.node);
  const rows = all.filter((b) => (!want || b.state === want) &&
    (!filter || [b.device_id, b.alias, b.board, b.client_id, b.node].some((v) => v && String(v).toLowerCase().includes(filter))));
  $('fleet').tBodies[0].replaceChildren(...rows.map((b) => el('tr', { class: b.state, 'data-id': b.device_id },
    el('td', { class: 'mac' }, el('a', { href: '#/board/' + encodeURIComponent(b.device_id), text: b.device_id })),
    el('td', { text: b.alias || '' }),
    el('td', { text: b.transport || '' }),
    el('td', {}, el('span', { class: 'state ' + b.state, text: b.state })),
    el('td', { text: b.board || '' }),
    el('td', { text: b.firmware_version || '' }),
    el('td', { text: String(b.tool_count || 0) }),
    el('td', { text: lastSeen(b) }),
    fleet ? el('td', { class: 'node', text: b.node || 'here' }) : null)));
  $('node-col').hidden = !fleet;
  $('empty').hidden = rows.length > 0;
  // An empty table says why: a token to enter, no board yet, or the filter.
  $('empty').textContent = state.locked ? 'Log in with a token to see the boards.'
    : !state.loaded ? 'Loading the boards…' : all.length === 0 ? 'No boards connected yet.' : 'No boards match.';
}

$('filter').addEventListener('input', renderFleet);
$('state-filter').addEventListener('change', renderFleet);

// --- OTA approvals ----------------------------------------------------------------
// With --ota-approval a board that boots shows a code on its screen and
// waits; the operator approves it here by that code. The list shows while
// approval mode is on or any board waits.

async function loadApprovals() {
  if (state.locked || !state.ota) return;
  let data;
  try {
    data = await api('GET', '/api/ota/devices');
  } catch (err) {
    if (err.status === 404) state.ota = false; // no OTA endpoint on this bridge
    return;
  }
  const pending = (data.devices || []).filter((d) => d.pending);
  const approved = (data.devices || []).filter((d) => d.admission === 'approved').length;
  $('approvals').hidden = !data.approval && pending.length === 0;
  $('ota-summary').textContent = data.approval ? '(approval mode; ' + approved + ' approved)' : '';
  $('ota-empty').hidden = pending.length > 0;
  $('ota').hidden = pending.length === 0;
  $('ota').tBodies[0].replaceChildren(...pending.map((d) => el('tr', { 'data-id': d.device_id, 'data-code': d.code },
    el('td', { class: 'code', text: d.code || '–' }),
    el('td', { class: 'mac', text: d.device_id }),
    el('td', {}, el('button', { class: 'primary', type: 'button', 'data-approve': d.device_id, text: 'Approve',
      onclick: (ev) => approve(d, ev.target) })),
    el('td', { text: d.board || '' }),
    el('td', { text: d.firmware || '' }),
    el('td', { text: d.first_seen ? new Date(d.first_seen).toLocaleTimeString() : '' }))));
}

async function approve(d, button) {
  button.disabled = true;
  // By MAC: one click is no guess, so the limit on wrong codes never applies.
  try {
    await api('POST', '/api/ota/devices/' + encodeURIComponent(d.device_id) + '/approve');
    $('ota-result').textContent = 'Approved ' + d.device_id + (d.code ? ' (code ' + d.code + ')' : '') +
      ': it connects at its next check, within a few seconds.';
  } catch (err) {
    $('ota-result').textContent = 'Could not approve ' + d.device_id + ': ' + err.message;
    button.disabled = false;
  }
  loadApprovals();
}

// --- a board --------------------------------------------------------------------

async function showBoard(id) {
  $('b-title').textContent = id;
  $('b-identity').replaceChildren();
  $('b-tools').replaceChildren(el('p', { class: 'muted', text: 'loading…' }));
  try {
    state.detail = await api('GET', '/api/devices/' + encodeURIComponent(id));
    renderBoard();
  } catch (err) {
    state.detail = { device_id: id, missing: true };
    $('b-tools').replaceChildren(el('p', { class: 'err', text: err.message }));
  }
}

async function refreshBoard(type) {
  const id = state.detail.device_id;
  if (type === 'offline') {
    const b = state.boards.get(id);
    state.detail = Object.assign({}, state.detail, { state: 'closed', close_reason: b && b.close_reason });
    renderIdentity();
    return;
  }
  await showBoard(id);
}

function renderIdentity() {
  const d = state.detail;
  const rows = [['MAC', d.device_id], ['alias', d.alias], ['client id', d.client_id], ['transport', d.transport], ['node', d.node],
    ['state', d.state + (d.close_reason ? ' (' + d.close_reason + ')' : '')], ['board', d.board],
    ['firmware', d.firmware_version], ['connected', d.connected_at && new Date(d.connected_at).toLocaleString()]];
  $('b-identity').replaceChildren(...rows.filter((r) => r[1]).flatMap(([k, v]) => [el('dt', { text: k }), el('dd', { text: String(v) })]));
}

function renderBoard() {
  const d = state.detail;
  $('b-title').textContent = d.device_id + (d.alias ? '  ·  ' + d.alias : '');
  renderIdentity();
  $('b-toolcount').textContent = '(' + d.tools.length + ', in device order)';
  $('b-tools').replaceChildren(...d.tools.map(toolCard));
}

// schemaProps lists a tool's arguments from whatever its board declared.
function schemaProps(schema) {
  const s = schema && typeof schema === 'object' ? schema : {};
  const req = new Set(Array.isArray(s.required) ? s.required : []);
  const props = s.properties && typeof s.properties === 'object' ? s.properties : {};
  return Object.entries(props).map(([name, p]) => ({ name, p: p && typeof p === 'object' ? p : {}, required: req.has(name) }));
}

function toolCard(tool) {
  // The bridge names the arguments whose default is help text, not a
  // value (argcheck.ProseDefault): one detector for the API, CLI and here.
  const prose = new Set(Array.isArray(tool.prose_defaults) ? tool.prose_defaults : []);
  const props = schemaProps(tool.inputSchema).map((f) => ({ ...f, prose: prose.has(f.name) }));
  const fields = props.map(fieldFor);
  const out = el('div', { class: 'result' });
  const run = el('button', { class: 'primary', type: 'submit', text: 'Run' });
  const form = el('form', { novalidate: true, 'data-tool': tool.name },
    el('div', { class: 'fields' }, ...fields.map((f) => f.node), run));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const args = Object.create(null); // keyed by the board's names
    for (const f of fields) {
      const v = f.value();
      if (v.error) { out.replaceChildren(el('p', { class: 'err', text: v.error })); return; }
      if (v.set) args[f.name] = v.value;
    }
    run.disabled = true;
    try {
      await runInteraction(tool.name, args, out);
    } finally {
      run.disabled = false;
    }
  });
  return el('div', { class: 'tool', 'data-tool': tool.name },
    el('h3', { text: tool.name }, tool.user_only ? el('span', { class: 'badge user', text: 'user only' }) : null),
    tool.description ? el('p', { class: 'desc', text: tool.description }) : null,
    form, out);
}

// fieldFor builds the input for one schema property: numbers with their
// range, enums as selects, booleans as toggles, anything else as JSON.
function fieldFor({ name, p, required, prose }) {
  const type = Array.isArray(p.type) ? p.type.find((t) => t !== 'null') : p.type;
  const label = el('span', { text: name + (p.description ? ' — ' + str(p.description) : '') }, required ? el('b', { class: 'req', text: ' *' }) : null);
  // A default that is really help text (the firmware's upgrade_firmware
  // url) is shown as a hint, never sent as a value.
  const has = p.default !== undefined && !prose;
  let input, read;
  if (type === 'boolean') {
    input = el('input', { type: 'checkbox', 'data-arg': name, checked: has && p.default === true });
    return { name, node: el('label', { class: 'field toggle' }, input, label), value: () => ({ set: true, value: input.checked }) };
  }
  if (Array.isArray(p.enum)) {
    input = el('select', { 'data-arg': name }, required && !has ? null : el('option', { value: '', text: has ? '' : '(none)' }),
      ...p.enum.map((v) => el('option', { value: JSON.stringify(v), text: str(v), selected: has && v === p.default })));
    if (required && !has) input.prepend(el('option', { value: '', text: '(choose)', selected: true }));
    read = () => input.value === '' ? { set: false } : { set: true, value: JSON.parse(input.value) };
  } else if (type === 'integer' || type === 'number') {
    input = el('input', { type: 'number', 'data-arg': name, min: p.minimum, max: p.maximum, step: type === 'integer' ? 1 : 'any',
      value: has ? p.default : undefined, placeholder: rangeText(p) });
    read = () => {
      if (input.value.trim() === '') return { set: false };
      const n = Number(input.value);
      return Number.isFinite(n) ? { set: true, value: n } : { error: name + ' must be a number' };
    };
  } else if (type === 'string') {
    input = el('input', { type: p.format === 'date' ? 'date' : 'text', 'data-arg': name, value: has ? p.default : undefined,
      placeholder: prose ? p.default : p.pattern ? 'pattern ' + str(p.pattern) : '', 'data-prose-default': prose });
    // Left empty, the board would fall back on that text: ask for a value.
    read = () => input.value !== '' ? { set: true, value: input.value }
      : prose ? { error: 'Enter ' + name + ": the board's default for it is help text, not a value." } : { set: false };
  } else {
    input = el('textarea', { 'data-arg': name, rows: 2, placeholder: prose ? p.default : 'JSON', 'data-prose-default': prose });
    if (has) input.value = JSON.stringify(p.default);
    read = () => {
      if (input.value.trim() === '') return { set: false };
      try { return { set: true, value: JSON.parse(input.value) }; } catch (_) { return { error: name + ' must be JSON' }; }
    };
  }
  const note = prose ? el('small', { class: 'note', text: "The board's default is help text, not a value: enter one." }) : null;
  return { name, node: el('label', { class: 'field' }, label, input, note), value: read };
}

function rangeText(p) {
  if (p.minimum !== undefined && p.maximum !== undefined) return str(p.minimum) + '–' + str(p.maximum);
  if (p.minimum !== undefined) return '≥ ' + str(p.minimum);
  if (p.maximum !== undefined) return '≤ ' + str(p.maximum);
  return '';
}

// --- guided calls -----------------------------------------------------------------
// A call always starts as an interaction: with every argument valid and no
// confirmation needed it runs at once; otherwise the bridge asks, prompt by
// prompt, and validates each answer before the board sees anything.

async function runInteraction(name, args, out) {
  const id = state.detail.device_id;
  out.replaceChildren(el('p', { class: 'muted', text: 'running…' }));
  let step;
  try {
    step = await api('POST', '/api/devices/' + encodeURIComponent(id) + '/interactions', { name, arguments: args });
  } catch (err) {
    showError(out, err);
    return;
  }
  await followSteps(step, out, { tool: name, board: boardName(state.detail), args: Object.assign(Object.create(null), args) });
}

// boardName is how a person knows a board: its alias, else its MAC.
function boardName(d) { return (d && (d.alias || d.device_id)) || ''; }

// followSteps answers prompts until the interaction ends. call is what it
// will run: the tool, the board and the arguments so far (for the
// confirmation's wording).
async function followSteps(step, out, call) {
  for (;;) {
    const prompt = step.initialPrompt || step.nextPrompt;
    if (!prompt) { showOutcome(step, out); return; }
    const answer = await ask(step, prompt, out, call);
    if (answer.declined) {
      // The bridge records the "no"; nothing reaches the board.
      try { step = await api('POST', '/api/interactions/' + encodeURIComponent(step.sessionId), { value: false }); } catch (_) { step = { state: 'cancelled' }; }
      out.replaceChildren(el('p', { class: 'muted', 'data-state': step.state || 'cancelled', text: 'Cancelled: nothing was sent to the board.' }));
      return;
    }
    if (!answer.cancel && prompt.property) call.args[prompt.property] = answer.value;
    if (answer.cancel) {
      try { await api('DELETE', '/api/interactions/' + encodeURIComponent(step.sessionId) + '?reason=user'); } catch (_) { /* already over */ }
      out.replaceChildren(el('p', { class: 'muted', 'data-state': 'cancelled', text: 'Cancelled: nothing was sent to the board.' }));
      return;
    }
    out.querySelectorAll('button').forEach((b) => { b.disabled = true; });
    try {
      step = await api('POST', '/api/interactions/' + encodeURIComponent(step.sessionId), { value: answer.value });
    } catch (err) {
      showError(out, err);
      return;
    }
  }
}

// ask shows one prompt and resolves with {value}, {cancel} or, for a
// confirmation, {declined}.
function ask(step, pr, out, call) {
  if (pr.type === 'confirm') return confirmCall(step, pr, out, call);
  return new Promise((resolve) => {
    const rules = pr.validation || {};
    let input, read;
    const row = el('div', { class: 'row' });
    // A default that is help text never reaches a prompt: the bridge
    // leaves it out (argcheck.ProseDefault).
    const def = pr.defaultValue;
    const hint = pr.placeholder;
    switch (pr.type) {
      case 'choice': {
        // A multiple choice (an array argument) takes any number of them.
        const chosen = (v) => pr.multiple
          ? Array.isArray(def) && def.some((d) => JSON.stringify(d) === JSON.stringify(v))
          : def !== undefined && JSON.stringify(def) === JSON.stringify(v);
        input = el('select', { 'data-arg': pr.property, multiple: !!pr.multiple }, ...(pr.choices || []).map((c) =>
          el('option', { value: JSON.stringify(c.value), text: c.label || str(c.value), selected: chosen(c.value) })));
        read = () => pr.multiple ? Array.from(input.selectedOptions, (o) => JSON.parse(o.value)) : JSON.parse(input.value);
        break;
      }
      case 'number':
        input = el('input', { type: 'number', 'data-arg': pr.property, min: rules.min, max: rules.max, step: rules.integer ? 1 : 'any', value: def,
          placeholder: rules.min !== undefined && rules.max !== undefined ? rules.min + '–' + rules.max : '' });
        read = () => input.value.trim() === '' ? null : Number(input.value);
        break;
      case 'custom':
        input = el('textarea', { 'data-arg': pr.property, rows: 2, placeholder: 'JSON' });
        if (def !== undefined) input.value = JSON.stringify(def);
        read = () => { try { return JSON.parse(input.value); } catch (_) { return input.value; } };
        break;
      default: // text, date
        input = el('input', { type: pr.type === 'date' ? 'date' : 'text', 'data-arg': pr.property, value: def, placeholder: hint });
        read = () => input.value;
    }
    const cancel = el('button', { type: 'button', 'data-answer': 'cancel', text: 'Cancel', onclick: () => resolve({ cancel: true }) });
    if (input) {
      row.append(input, el('button', { class: 'primary', type: 'submit', 'data-answer': 'submit', text: 'Answer' }));
    }
    row.append(cancel);
    const pg = step.progress || { current: 1, total: 1 };
    const form = el('form', { class: 'prompt', novalidate: true, 'data-prompt': pr.property || 'confirm' },
      el('div', { class: 'row' }, el('progress', { max: pg.total, value: pg.current }),
        el('span', { class: 'muted', text: pg.message || ('Step ' + pg.current + ' of ' + pg.total) })),
      el('p', { class: 'msg', text: pr.message }),
      row,
      pr.error ? el('p', { class: 'hint err', 'data-error': '', text: sentence(pr.error) + (pr.suggestion ? ' ' + sentence(pr.suggestion) : '') }) : null);
    form.addEventListener('submit', (ev) => { ev.preventDefault(); resolve({ value: read ? read() : null }); });
    out.replaceChildren(form);
    if (input) input.focus();
  });
}

// What some firmware tools do to the board, said before they run.
const EFFECTS = {
  'self.reboot': 'The board restarts and drops off for about 10 s.',
  'self.upgrade_firmware': 'The board downloads and installs the firmware, then restarts; it is offline until it is done.',
};

// confirmCall asks a person whether to run the call: "Run self.reboot on
// dev_000001?", what it does, the arguments, and Yes / Cancel. The
// bridge's own question (worded for a model too) is secondary text, less
// what only a model needs ("answer true or false", "with {}").
function confirmCall(step, pr, out, call) {
  return new Promise((resolve) => {
    const names = Object.keys(call.args);
    const detail = humanConfirm(pr.message, call.tool);
    const yes = el('button', { class: 'primary', type: 'button', 'data-answer': 'yes', text: 'Yes, run it', onclick: () => resolve({ value: true }) });
    const form = el('form', { class: 'prompt confirm', novalidate: true, 'data-prompt': 'confirm' },
      el('p', { class: 'question', text: 'Run ' + call.tool + ' on ' + call.board + '?' }),
      EFFECTS[call.tool] ? el('p', { class: 'effect', text: EFFECTS[call.tool] }) : null,
      names.length ? el('dl', { class: 'args' }, ...names.flatMap((k) => [el('dt', { text: k }), el('dd', { text: str(call.args[k]) })])) : null,
      detail ? el('p', { class: 'msg muted', text: detail }) : null,
      el('div', { class: 'row' }, yes,
        el('button', { type: 'button', 'data-answer': 'cancel', text: 'Cancel', onclick: () => resolve({ declined: true }) })),
      pr.error ? el('p', { class: 'hint err', 'data-error': '', text: sentence(pr.error) }) : null);
    form.addEventListener('submit', (ev) => { ev.preventDefault(); resolve({ value: true }); });
    out.replaceChildren(form);
    yes.focus();
  });
}

// humanConfirm keeps what the bridge's confirmation says beyond the
// question itself, without instructions meant for a model.
function humanConfirm(msg, tool) {
  if (typeof msg !== 'string') return '';
  const sentences = msg.replace(/\s+with\s+\{\s*\}/g, '').split(/(?<=[.?!])\s+/);
  const question = new RegExp('^run ' + tool.replace(/[.*+?^${}()|[\]\\]/g, '\\$&') + '\\b.*\\?$', 'i');
  const kept = sentences.map((x) => x.trim()).filter((x) => x &&
    !/\b(true|yes)\b.*\b(false|no)\b/i.test(x) && // "Answer true to run it, or false…"
    !question.test(x)); // the question again, maybe with the arguments as JSON
  return kept.join(' ');
}

function showOutcome(step, out) {
  const r = step.result || {};
  const box = el('div', { class: 'result' + (r.success === false ? ' error' : ''), 'data-state': step.state });
  if (step.summary) box.append(el('p', { class: 'muted', text: step.summary }));
  const content = r.data && Array.isArray(r.data.content) ? r.data.content : null;
  if (content) {
    for (const c of content) box.append(...renderContent(c));
  } else if (r.text) {
    box.append(el('pre', { text: r.text }));
  }
  out.replaceChildren(box);
}

function renderContent(c) {
  let item = c;
  if (c.type === 'image' && c.image && !c.data) { // the firmware's nested image item
    try { item = JSON.parse(c.image); } catch (_) { /* shown as text below */ }
  }
  if (item.type === 'image' && item.data && /^image\/[a-z0-9.+-]+$/i.test(item.mimeType || '')) {
    return [el('img', { alt: 'image result', src: 'data:' + item.mimeType + ';base64,' + item.data })];
  }
  return [el('pre', { text: pretty(c.text !== undefined ? c.text : JSON.stringify(c)) })];
}

function pretty(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (_) { return text; }
}

function showError(out, err) {
  const b = err.body && err.body.error;
  const box = el('div', { class: 'result error' }, el('pre', { text: (b ? b.code + ': ' : '') + err.message }));
  if (b && b.problems) box.append(el('pre', { text: b.problems.join('\n') }));
  out.replaceChildren(box);
}

// --- routing ----------------------------------------------------------------------

function route() {
  const m = location.hash.match(/^#\/board\/(.+)$/);
  $('fleet-view').hidden = !!m;
  $('board-view').hidden = !m;
  if (m) {
    showBoard(decodeURIComponent(m[1]));
  } else {
    state.detail = null;
    renderFleet();
  }
}

// refreshSide reads what has no event of its own: the plots and the
// boards waiting for approval.
function refreshSide() {
  loadStats();
  loadApprovals();
}

window.addEventListener('hashchange', route);
setInterval(() => { if (!document.hidden) refreshSide(); }, 5000);
restartEvents();
route();
refreshSide();
