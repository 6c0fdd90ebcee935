// Browser test of the web console, run by .ci/run: builds the bridge and the
// simulator, starts `bridge --simulate 3` on free loopback ports, and drives
// the console in Debian's chromium through playwright-core, at 1400 px and
// 420 px wide (no sideways scrolling of the page at 420):
//   - a page opened after some calls shows them: the event log's history,
//     the header's last minute and the plots of the last 15 minutes;
//   - the fleet lists the three boards, then a fourth that connects, and
//     shows it closed when it leaves, without a reload;
//   - setting a volume through the generated form changes the board
//     (checked through the control API);
//   - a call with a missing argument completes through the prompts, after a
//     refused answer;
//   - a tool that needs confirmation asks in plain words (never "{}" or
//     "true/false"), and Cancel sends nothing;
//   - a default that is really help text (upgrade_firmware's url) is a
//     hint, not a value;
//   - a board whose arguments are named addEventListener, __proto__ and
//     other members of forms and objects (clobber.yaml) keeps its tools on
//     the page, and every argument reaches it, through a prompt too;
//   - with a control token and --ota-approval, the console says to log in
//     (not "no boards match"), then lists the board waiting for approval
//     with its code, and one click on Approve brings it into the fleet;
//   - in a fleet of two bridges on one NATS (nats-server on PATH, or
//     $NATS_SERVER, run from configs/nats-fleet.conf: credentials
//     required), node b lists node a's boards and names their node.
// Screenshots of every page go to a temporary directory, printed at the end.
// Any failure exits 1.
import { chromium } from 'playwright-core';
import { spawn, execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import net from 'node:net';

const repo = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const out = mkdtempSync(join(tmpdir(), 'devicebridge-console-'));
const T = 15000; // every wait is bounded
const WIDE = { width: 1400, height: 900 };
const NARROW = { width: 420, height: 900 };

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

function start(bin, args, name) {
  // The bridges keep their state in their default data directory, which
  // lies under XDG_STATE_HOME: here a folder of this run, never the home.
  const env = { ...process.env, XDG_STATE_HOME: join(out, 'state') };
  const p = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'], env });
  let err = '';
  p.stderr.on('data', (d) => { err = (err + d).slice(-4000); });
  p.on('exit', (code, sig) => { if (code && !p.stopping) console.error(`${name} exited ${code} ${sig || ''}:\n${err}`); });
  return p;
}

function stop(p) {
  return new Promise((resolve) => {
    if (p.exitCode !== null || p.signalCode !== null) return resolve();
    p.stopping = true;
    p.on('exit', resolve);
    p.kill('SIGTERM');
  });
}

async function until(what, f) {
  const deadline = Date.now() + T;
  let last;
  while (Date.now() < deadline) {
    try { last = await f(); if (last) return last; } catch (e) { last = e; }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what} (last: ${last})`);
}

function check(cond, msg) {
  if (!cond) throw new Error('check failed: ' + msg);
  console.log('ok   ' + msg);
}

// narrow takes the page to 420 px: the page itself must not scroll
// sideways (a wide table scrolls in its wrapper), then a screenshot, then
// back to 1400 px.
async function narrow(page, name, what) {
  await page.setViewportSize(NARROW);
  await page.waitForFunction((w) => window.innerWidth === w, NARROW.width, { timeout: T });
  const [sw, iw] = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
  check(sw <= iw, `at ${iw} px ${what} fits: scrollWidth ${sw}`);
  await page.screenshot({ path: join(out, name + '-420.png'), fullPage: true });
  await page.setViewportSize(WIDE);
}

const procs = [];
let browser;
let failed = false;
try {
  console.log('building bridge and simulator…');
  execFileSync('go', ['build', '-o', join(out, 'bridge'), './cmd/bridge'], { cwd: repo, stdio: 'inherit' });
  execFileSync('go', ['build', '-o', join(out, 'simulator'), './cmd/simulator'], { cwd: repo, stdio: 'inherit' });
  const [cp, dp] = [await freePort(), await freePort()];
  const base = `http://127.0.0.1:${cp}`;
  const bridge = start(join(out, 'bridge'), ['--simulate', '3', '--control-listen', `127.0.0.1:${cp}`,
    '--device-listen', `127.0.0.1:${dp}`, '--mqtt-listen', '', '--log-level', 'warn'], 'bridge');
  procs.push(bridge);
  const getJSON = async (path) => (await fetch(base + path)).json();
  const postJSON = async (path, body) => (await fetch(base + path, { method: 'POST', body: JSON.stringify(body) })).json();
  await until('three ready boards', async () => (await getJSON('/api/devices')).devices.filter((d) => d.state === 'ready').length === 3);
  // Calls before the page opens: it must show them anyway.
  for (let i = 0; i < 3; i++) await postJSON('/api/devices/02:00:00:00:00:02/call', { name: 'self.get_device_status' });
  await postJSON('/api/devices/02:00:00:00:00:02/call', { name: 'self.no_such_tool' });

  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
  });
  const page = await browser.newPage({ viewport: WIDE });
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') pageErrors.push(m.text()); });

  // The fleet.
  await page.goto(base + '/');
  await page.waitForSelector('#live.on', { timeout: T });
  await page.waitForFunction(() => document.querySelectorAll('#fleet tbody tr.ready').length === 3, null, { timeout: T });
  const ids = await page.$$eval('#fleet tbody tr', (rows) => rows.map((r) => r.dataset.id));
  check(ids.join(',') === '02:00:00:00:00:01,02:00:00:00:00:02,02:00:00:00:00:03', 'the fleet lists the three simulated boards: ' + ids.join(', '));
  check((await page.textContent('#counts [data-state="ready"] b')) === '3', 'the ready count is 3');
  check(await page.isHidden('#node-col'), 'a bridge alone shows no node column');

  // The recent past: history in the log, the last minute in the header,
  // the last 15 minutes in the plots, all from before the page opened.
  await page.waitForSelector('#events li.past[data-type="call"]', { timeout: T });
  const past = await page.$$eval('#events li.past', (li) => li.map((x) => x.textContent));
  check(past.filter((t) => t.includes('02:00:00:00:00:02 self.get_device_status → ok')).length === 3 &&
    past.some((t) => t.includes('self.no_such_tool → unknown_tool')), 'the event log opens with the calls made before the page: ' + past.length + ' past events');
  check(past.some((t) => t.includes('online 02:00:00:00:00:01')), 'and the boards coming online');
  await page.waitForFunction(() => Number(document.getElementById('m-rate').textContent) > 0 &&
    document.querySelector('.plot[data-plot="rate"]').dataset.calls === '4', null, { timeout: T });
  check((await page.textContent('#m-errors')) === '1' && (await page.textContent('#m-p50')) !== '–',
    'the header shows the last minute of calls, from the bridge: rate ' + (await page.textContent('#m-rate')) + '/s, 1 error, p50 ' + (await page.textContent('#m-p50')));
  check((await page.$$('.plot[data-plot="rate"] rect.bar.ok')).length >= 1 && (await page.$$('.plot[data-plot="errors"] rect.bar.bad')).length >= 1 &&
    (await page.$$('.plot[data-plot="latency"] svg .p99')).length >= 1, 'the plots show the calls, the error and the latency of the last minutes');
  await page.screenshot({ path: join(out, 'fleet.png'), fullPage: true });
  await narrow(page, 'fleet', 'the fleet');

  // A board connects, then leaves: the page follows without a reload.
  const sim = start(join(out, 'simulator'), ['--url', `ws://127.0.0.1:${dp}/xiaozhi/v1/`, '--mac-prefix', '02:00:09',
    '--count', '1', '--log-level', 'warn'], 'simulator');
  procs.push(sim);
  await page.waitForSelector('#fleet tr[data-id="02:00:09:00:00:01"].ready', { timeout: T });
  check((await page.textContent('#counts [data-state="ready"] b')) === '4', 'a board that connects appears, ready (count 4)');
  await page.screenshot({ path: join(out, 'fleet-joined.png'), fullPage: true });
  await stop(sim);
  await page.waitForSelector('#fleet tr[data-id="02:00:09:00:00:01"].closed', { timeout: T });
  check((await page.textContent('#counts [data-state="closed"] b')) === '1' &&
    (await page.textContent('#counts [data-state="ready"] b')) === '3', 'the board that leaves is shown closed (ready 3, closed 1)');
  await page.selectOption('#state-filter', 'closed');
  check((await page.$$('#fleet tbody tr')).length === 1, 'filtering by state closed shows just that board');
  await page.screenshot({ path: join(out, 'fleet-left.png'), fullPage: true });
  await page.selectOption('#state-filter', '');
  await page.fill('#filter', '00:00:02');
  check((await page.$$eval('#fleet tbody tr', (r) => r.map((x) => x.dataset.id))).join() === '02:00:00:00:00:02', 'filtering by name narrows the list');
  await page.fill('#filter', '');

  // A board: set the volume through the form.
  await page.click('a[href="#/board/02%3A00%3A00%3A00%3A00%3A01"]');
  const vol = '.tool[data-tool="self.audio_speaker.set_volume"]';
  await page.waitForSelector(vol, { timeout: T });
  const names = await page.$$eval('.tool h3', (hs) => hs.map((h) => h.firstChild.textContent));
  const detail = await getJSON('/api/devices/02:00:00:00:00:01');
  check(names.join() === detail.tools.map((t) => t.name).join(), `tools in device order (${names.length})`);
  check(await page.isVisible('.tool[data-tool="self.reboot"] .badge.user'), 'user-only tools are marked');
  await page.fill(`${vol} input[data-arg="volume"]`, '35');
  await page.click(`${vol} button[type="submit"]`);
  await page.waitForSelector(`${vol} .result [data-state="completed"]`, { timeout: T });
  const status = async () => {
    const r = await postJSON('/api/devices/02:00:00:00:00:01/call', { name: 'self.get_device_status' });
    return JSON.parse(r.content[0].text).audio_speaker.volume;
  };
  check((await status()) === 35, 'the form set the volume: the board reports 35');
  await page.screenshot({ path: join(out, 'board.png'), fullPage: true });
  await narrow(page, 'board', 'a board page');

  // A default that is really help text is a hint, not a value.
  const url = '.tool[data-tool="self.upgrade_firmware"] form[data-tool] input[data-arg="url"]';
  check((await page.inputValue(url)) === '' && (await page.getAttribute(url, 'placeholder')).startsWith('The URL of the firmware') &&
    (await page.getAttribute(url, 'data-prose-default')) !== null, "upgrade_firmware's url is empty, its prose default only a hint");
  const upgrade = '.tool[data-tool="self.upgrade_firmware"]';
  await page.click(`${upgrade} form[data-tool] button[type="submit"]`);
  await page.waitForSelector(`${upgrade} .result .err`, { timeout: T });
  check((await page.textContent(`${upgrade} .result .err`)).includes('help text') && !(await page.$(`${upgrade} form.prompt`)),
    'Run with it empty asks for a URL and starts nothing (the board would take the help text as one)');

  // A call missing its argument completes through the prompts.
  await page.fill(`${vol} input[data-arg="volume"]`, '');
  await page.click(`${vol} form[data-tool] button[type="submit"]`);
  await page.waitForSelector(`${vol} form.prompt[data-prompt="volume"]`, { timeout: T });
  check((await page.textContent(`${vol} form.prompt`)).includes('Step 1 of 1'), 'the missing volume is asked, with progress');
  await page.fill(`${vol} form.prompt input`, '150');
  await page.click(`${vol} form.prompt button[data-answer="submit"]`);
  await page.waitForSelector(`${vol} form.prompt [data-error]`, { timeout: T });
  check((await page.textContent(`${vol} form.prompt [data-error]`)).includes('100'), 'an out-of-range answer is refused with the reason');
  await page.screenshot({ path: join(out, 'board-prompt.png'), fullPage: true });
  await page.fill(`${vol} form.prompt input`, '40');
  await page.click(`${vol} form.prompt button[data-answer="submit"]`);
  await page.waitForSelector(`${vol} .result [data-state="completed"]`, { timeout: T });
  check((await status()) === 40, 'the interaction completed: the board reports 40');

  // A dangerous tool asks for confirmation, in words for a person;
  // Cancel sends nothing.
  const reboot = '.tool[data-tool="self.reboot"]';
  await page.click(`${reboot} button[type="submit"]`);
  await page.waitForSelector(`${reboot} form.prompt.confirm button[data-answer="cancel"]`, { timeout: T });
  const who = detail.alias || detail.device_id;
  const question = await page.textContent(`${reboot} form.prompt .question`);
  check(question === `Run self.reboot on ${who}?`, 'the confirmation asks: ' + question);
  const confirmText = await page.textContent(`${reboot} form.prompt`);
  check(!/\{\}|\btrue\b|\bfalse\b/.test(confirmText), 'and never says "{}", "true" or "false": ' + confirmText);
  check((await page.$$eval(`${reboot} form.prompt button`, (bs) => bs.map((b) => b.textContent))).join('/') === 'Yes, run it/Cancel',
    'its buttons are Yes and Cancel');
  await page.screenshot({ path: join(out, 'board-confirm.png') });
  await narrow(page, 'board-confirm', 'a confirmation');
  await page.click(`${reboot} form.prompt button[data-answer="cancel"]`);
  await page.waitForSelector(`${reboot} .result [data-state="cancelled"]`, { timeout: T });
  check((await getJSON('/api/devices/02:00:00:00:00:01')).state === 'ready', 'cancelling the reboot left the board alone');

  // Images in a result are shown as images (no simulated tool returns one,
  // so the bridge's answer is stood in for here).
  const png = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
  await page.route('**/api/devices/*/interactions', (route) => route.fulfill({ contentType: 'application/json', body: JSON.stringify({
    sessionId: 'flw_test', state: 'completed', summary: 'stand-in',
    result: { success: true, text: '', data: { content: [{ type: 'image', mimeType: 'image/png', data: png }, { type: 'text', text: '{"w":1}' }] } } }) }));
  const info = '.tool[data-tool="self.screen.get_info"]';
  await page.click(`${info} button[type="submit"]`);
  await page.waitForSelector(`${info} .result img[src^="data:image/png;base64,"]`, { timeout: T });
  check((await page.textContent(`${info} .result pre`)).includes('"w": 1'), 'image results show as images, JSON text pretty-printed');
  await page.unroute('**/api/devices/*/interactions');

  // A board whose argument names are names of form and object members:
  // its tools stay on the page and every argument reaches the board, the
  // one left empty through a prompt whose input has that name too.
  const clob = start(join(out, 'simulator'), ['--url', `ws://127.0.0.1:${dp}/xiaozhi/v1/`, '--mac-prefix', '02:00:0c',
    '--count', '1', '--profile', join(repo, 'console', 'test', 'clobber.yaml'), '--log-level', 'warn'], 'clobber simulator');
  procs.push(clob);
  await until('the clobber board', async () => (await getJSON('/api/devices/02:00:0c:00:00:01')).state === 'ready');
  await page.goto(base + '/#/board/' + encodeURIComponent('02:00:0c:00:00:01'));
  const clobSet = '.tool[data-tool="self.clobber.set"]';
  await page.waitForSelector(clobSet, { timeout: T });
  const clobTools = await page.$$eval('.tool h3', (hs) => hs.map((h) => h.firstChild.textContent));
  check(clobTools.join() === 'self.clobber.set,self.clobber.get_proto',
    'arguments named addEventListener, __proto__… leave the board\'s tools on the page');
  const clobArgs = await page.$$eval(`${clobSet} form[data-tool] [data-arg]`, (xs) => xs.map((x) => x.dataset.arg));
  check(clobArgs.length === 11 && clobArgs.includes('__proto__') && clobArgs.includes('addEventListener'),
    'every argument has its input: ' + clobArgs.join(', '));
  // Pairs, not an object literal: {__proto__: …} would set a prototype.
  for (const [k, v] of [['__proto__', 'kept'], ['constructor', 'c'], ['toString', '3'], ['elements', 'e'], ['action', 'a'],
    ['name', 'n'], ['id', 'i'], ['length', '2'], ['querySelectorAll', 'q']]) {
    await page.fill(`${clobSet} form[data-tool] [data-arg="${k}"]`, v);
  }
  await page.click(`${clobSet} form[data-tool] button[type="submit"]`);
  await page.waitForSelector(`${clobSet} form.prompt[data-prompt="addEventListener"]`, { timeout: T });
  await page.fill(`${clobSet} form.prompt [data-arg="addEventListener"]`, '7');
  await page.click(`${clobSet} form.prompt button[data-answer="submit"]`);
  await page.waitForSelector(`${clobSet} .result [data-state="completed"]`, { timeout: T });
  const proto = await postJSON('/api/devices/02:00:0c:00:00:01/call', { name: 'self.clobber.get_proto' });
  check(proto.content[0].text === 'kept', 'the __proto__ argument reached the board as an argument, after a prompt for addEventListener');
  await page.screenshot({ path: join(out, 'board-clobber.png'), fullPage: true });
  await stop(clob);

  // The event log and the metrics saw the calls.
  await page.waitForFunction(() => Number(document.getElementById('m-rate').textContent) > 0, null, { timeout: T });
  check((await page.$$eval('#events li', (li) => li.map((x) => x.textContent))).some((t) => t.includes('self.audio_speaker.set_volume → ok')),
    'the event log shows the calls, the metrics count them');
  await page.screenshot({ path: join(out, 'board-done.png'), fullPage: true });
  check(pageErrors.length === 0, 'no script errors in the page' + (pageErrors.length ? ': ' + pageErrors.join('; ') : ''));

  // With control tokens the console asks for one, then shows the fleet.
  // In approval mode the simulated board boots through OTA and waits for
  // an operator, with a code on its screen.
  const [cp2, dp2] = [await freePort(), await freePort()];
  const base2 = `http://127.0.0.1:${cp2}`;
  procs.push(start(join(out, 'bridge'), ['--simulate', '1', '--control-token', 's3cret', '--ota-approval', '--data-dir', join(out, 'data'),
    '--control-listen', `127.0.0.1:${cp2}`, '--device-listen', `127.0.0.1:${dp2}`, '--mqtt-listen', '', '--log-level', 'warn'], 'bridge with a token'));
  const otaList = async () => (await fetch(base2 + '/api/ota/devices', { headers: { Authorization: 'Bearer s3cret' } })).json();
  const waiting = await until('a board waiting for approval', async () => (await otaList()).devices.find((d) => d.pending && d.code));
  const page2 = await browser.newPage({ viewport: WIDE });
  page2.on('pageerror', (e) => pageErrors.push(String(e)));
  page2.on('console', (m) => { if (m.type() === 'error' && !m.text().includes('401')) pageErrors.push(m.text()); });
  await page2.goto(base2 + '/');
  await page2.waitForSelector('#login:not([hidden])', { timeout: T });
  await page2.waitForSelector('#empty:not([hidden])', { timeout: T });
  check((await page2.$$('#fleet tbody tr')).length === 0 && (await page2.textContent('#empty')) === 'Log in with a token to see the boards.',
    'without a token the console shows no board and says to log in: ' + (await page2.textContent('#empty')));
  check(await page2.isHidden('#approvals') && await page2.isHidden('#activity') && await page2.isHidden('#events'),
    'nor approvals, plots or events');
  await page2.screenshot({ path: join(out, 'token.png'), fullPage: true });
  await narrow(page2, 'token', 'the login');
  await page2.fill('#token', 'wrong');
  await page2.click('#login button');
  await page2.waitForFunction(() => document.getElementById('login-error').textContent.includes('refused'), null, { timeout: T });
  await page2.fill('#token', 's3cret');
  await page2.click('#login button');
  await page2.waitForSelector('#live.on', { timeout: T });
  check(await page2.isHidden('#login'), 'with the token the console goes live');

  // The board waiting for approval, with its code; one click approves it.
  const row = `#ota tr[data-id="${waiting.device_id}"]`;
  await page2.waitForSelector(row, { timeout: T });
  check((await page2.textContent(`${row} td.code`)) === waiting.code, `the board waiting for approval is listed with its code ${waiting.code}`);
  await page2.screenshot({ path: join(out, 'approvals.png'), fullPage: true });
  await narrow(page2, 'approvals', 'the approvals');
  await page2.click(`${row} button[data-approve]`);
  await page2.waitForSelector('#ota-empty:not([hidden])', { timeout: T });
  check((await page2.textContent('#ota-result')).includes('Approved ' + waiting.device_id), 'Approve approves it: ' + (await page2.textContent('#ota-result')));
  await page2.waitForSelector(`#fleet tr[data-id="${waiting.device_id}"].ready`, { timeout: 2 * T });
  check((await otaList()).devices.find((d) => d.device_id === waiting.device_id).admission === 'approved',
    'and the board connects and shows ready in the fleet');
  await page2.screenshot({ path: join(out, 'approved.png'), fullPage: true });
  check(pageErrors.length === 0, 'no script errors in the page with a token' + (pageErrors.length ? ': ' + pageErrors.join('; ') : ''));

  // A fleet of two bridges on one NATS (docs/scaling.md): node b's console
  // lists node a's boards too, and names the node that holds each. NATS
  // runs as the docs run it, and reads the fleet's password from the
  // environment, as the nodes do.
  const np = await freePort();
  process.env.DEVICEBRIDGE_NATS_PASSWORD = randomBytes(18).toString('base64');
  procs.push(start(process.env.NATS_SERVER || 'nats-server', ['-c', join(repo, 'configs', 'nats-fleet.conf'), '-p', String(np),
    '-sd', join(out, 'js')], 'nats-server'));
  await until('nats-server', () => new Promise((resolve) => {
    const c = net.connect(np, '127.0.0.1', () => { c.end(); resolve(true); });
    c.on('error', () => resolve(false));
  }));
  const [ca, da, cb, db] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const node = (id, c, d, extra) => start(join(out, 'bridge'), ['--nats', `nats://127.0.0.1:${np}`, '--nats-user', 'devicebridge', '--node-id', id,
    '--control-listen', `127.0.0.1:${c}`, '--device-listen', `127.0.0.1:${d}`, '--mqtt-listen', '', '--log-level', 'warn', ...extra], 'node ' + id);
  procs.push(node('a', ca, da, ['--simulate', '2']));
  procs.push(node('b', cb, db, []));
  procs.push(start(join(out, 'simulator'), ['--url', `ws://127.0.0.1:${db}/xiaozhi/v1/`, '--mac-prefix', '02:00:0b',
    '--count', '1', '--log-level', 'warn'], 'simulator on node b'));
  const page3 = await browser.newPage({ viewport: WIDE });
  await until('node b', async () => (await fetch(`http://127.0.0.1:${cb}/healthz`)).ok);
  await page3.goto(`http://127.0.0.1:${cb}/`);
  await page3.waitForFunction(() => document.querySelectorAll('#fleet tbody tr.ready').length === 3, null, { timeout: T });
  const holders = await page3.$$eval('#fleet tbody tr', (rows) => rows.map((r) => r.dataset.id + '@' + r.querySelector('td.node').textContent));
  check(holders.join(',') === '02:00:00:00:00:01@a,02:00:00:00:00:02@a,02:00:0b:00:00:01@here',
    "node b's console lists node a's boards and its own, with their node: " + holders.join(', '));
  check(await page3.isVisible('#node-col'), 'in a fleet the node column shows');
  await page3.screenshot({ path: join(out, 'fleet-nodes.png'), fullPage: true });
} catch (e) {
  failed = true;
  console.error('FAIL ' + (e.stack || e));
} finally {
  if (browser) await browser.close();
  for (const p of procs.reverse()) await stop(p);
  console.log('screenshots: ' + out);
}
process.exit(failed ? 1 : 0);
