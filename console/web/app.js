// devicebridge web console. Plain JavaScript, no library: the fleet from
// /api/devices kept live by /api/events, a board page whose forms come from
// each tool's input schema, guided calls through /api/interactions, an event
// log and call metrics computed from the same event stream.
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
  calls: [],         // {t, ms, ok} of the last minute, from call events
  since: Date.now(),
  detail: null,      // the board shown on the board page
};

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
      const resp = await fetch('/api/events', { headers, signal });
      if (resp.status === 401) { setLive(false, 'token needed'); needToken(); return; }
      if (!resp.ok || !resp.body) throw new Error('HTTP ' + resp.status);
      setLive(true);
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
          if (data) onEvent(type, JSON.parse(data));
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
      logEvent(type, data.device_id + (data.tool_count ? ' (' + data.tool_count + ' tools)' : '') + ' ' + data.state);
      break;
    case 'offline':
      state.boards.set(data.device_id, Object.assign({}, data, { state: 'closed' }));
      logEvent(type, data.device_id + ': ' + (data.close_reason || 'gone'), true);
      break;
    case 'call':
      state.calls.push({ t: Date.now(), ms: data.duration_ms, ok: data.code === 'ok' });
      logEvent(type, data.device_id + ' ' + data.tool + ' → ' + data.code + ' in ' + fmtMS(data.duration_ms), data.code !== 'ok');
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

function logEvent(type, text, bad) {
  const list = $('events');
  list.prepend(el('li', { class: bad ? 'bad' : '' },
    el('span', { class: 't', text: new Date().toLocaleTimeString() }), type + ' ' + text));
  while (list.children.length > 200) list.lastChild.remove();
}

// --- metrics: the last minute of call events --------------------------------

function renderMetrics() {
  const now = Date.now();
  state.calls = state.calls.filter((c) => now - c.t < 60000);
  const window = Math.max(1, Math.min(60, (now - state.since) / 1000));
  $('m-rate').textContent = (state.calls.length / window).toFixed(state.calls.length ? 2 : 0);
  $('m-errors').textContent = String(state.calls.filter((c) => !c.ok).length);
  const ms = state.calls.map((c) => c.ms).sort((a, b) => a - b);
  const q = (p) => ms.length ? fmtMS(ms[Math.min(ms.length - 1, Math.ceil(p * ms.length) - 1)]) : '–';
  $('m-p50').textContent = q(0.5);
  $('m-p99').textContent = q(0.99);
}

function fmtMS(ms) {
  if (ms >= 1000) return (ms / 1000).toFixed(2) + ' s';
  return (ms >= 10 ? ms.toFixed(0) : ms.toFixed(1)) + ' ms';
}

// --- the fleet ----------------------------------------------------------------

async function loadFleet() {
  try {
    const data = await api('GET', '/api/devices');
    state.node = data.node || '';
    const seen = new Set();
    for (const d of data.devices) { state.boards.set(d.device_id, d); seen.add(d.device_id); }
    for (const [id, b] of state.boards) if (!seen.has(id) && b.state !== 'closed') state.boards.set(id, Object.assign({}, b, { state: 'closed' }));
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
}

$('filter').addEventListener('input', renderFleet);
$('state-filter').addEventListener('change', renderFleet);

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
  const props = schemaProps(tool.inputSchema);
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
function fieldFor({ name, p, required }) {
  const type = Array.isArray(p.type) ? p.type.find((t) => t !== 'null') : p.type;
  const label = el('span', { text: name + (p.description ? ' — ' + str(p.description) : '') }, required ? el('b', { class: 'req', text: ' *' }) : null);
  const has = p.default !== undefined;
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
      placeholder: p.pattern ? 'pattern ' + str(p.pattern) : '' });
    read = () => input.value === '' ? { set: false } : { set: true, value: input.value };
  } else {
    input = el('textarea', { 'data-arg': name, rows: 2, placeholder: 'JSON' });
    if (has) input.value = JSON.stringify(p.default);
    read = () => {
      if (input.value.trim() === '') return { set: false };
      try { return { set: true, value: JSON.parse(input.value) }; } catch (_) { return { error: name + ' must be JSON' }; }
    };
  }
  return { name, node: el('label', { class: 'field' }, label, input), value: read };
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
  await followSteps(step, out);
}

async function followSteps(step, out) {
  for (;;) {
    const prompt = step.initialPrompt || step.nextPrompt;
    if (!prompt) { showOutcome(step, out); return; }
    const answer = await ask(step, prompt, out);
    if (answer.cancel) {
      try { await api('DELETE', '/api/interactions/' + encodeURIComponent(step.sessionId) + '?reason=user'); } catch (_) { /* already over */ }
      out.replaceChildren(el('p', { class: 'muted', text: 'Cancelled: nothing was sent to the board.' }));
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

// ask shows one prompt and resolves with {value} or {cancel}.
function ask(step, pr, out) {
  return new Promise((resolve) => {
    const rules = pr.validation || {};
    let input, read;
    const row = el('div', { class: 'row' });
    const def = pr.defaultValue;
    switch (pr.type) {
      case 'confirm':
        row.append(el('button', { class: 'primary', type: 'button', 'data-answer': 'yes', text: 'Yes', onclick: () => resolve({ value: true }) }),
          el('button', { type: 'button', 'data-answer': 'no', text: 'No', onclick: () => resolve({ value: false }) }));
        break;
      case 'choice':
        input = el('select', { 'data-arg': pr.property }, ...(pr.choices || []).map((c) =>
          el('option', { value: JSON.stringify(c.value), text: c.label || str(c.value), selected: def !== undefined && JSON.stringify(def) === JSON.stringify(c.value) })));
        read = () => JSON.parse(input.value);
        break;
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
        input = el('input', { type: pr.type === 'date' ? 'date' : 'text', 'data-arg': pr.property, value: def, placeholder: pr.placeholder });
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

window.addEventListener('hashchange', route);
setInterval(renderMetrics, 1000);
restartEvents();
route();
