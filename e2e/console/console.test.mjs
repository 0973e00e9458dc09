// Browser end-to-end test of the operator console that `idem serve` serves under /console/.
//
// A plain Node script (no test runner): playwright-core drives the machine's Chromium
// (never a downloaded one) against a running server. The Rust test
// crates/idem/tests/console_browser.rs starts that server on a fresh database and runs
// this script; see README.md beside it to run it by hand.
//
// Environment:
//   IDEM_BASE_URL       http://127.0.0.1:PORT of the running `idem serve`
//   IDEM_ADMIN_TOKEN    the server's --admin-token (the console's login token)
//   IDEM_API_KEY        tenant IDEM_TENANT's API secret (Authorization: Bearer …)
//   IDEM_TENANT         the tenant of IDEM_API_KEY (default t1)
//   IDEM_BIN            the idem binary (for `idem demo incident`)
//   IDEM_DATABASE_URL   the server's --database-url (the demo writes into it)
//   IDEM_CHROMIUM       Chromium (default /usr/bin/chromium)
//   IDEM_E2E_BACKEND    a name for the messages (default: from IDEM_DATABASE_URL)
//   IDEM_E2E_ARTIFACTS  a directory for a screenshot of every page (optional)

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

// ---------------------------------------------------------------------------------------
// Settings

function need(name) {
  const v = process.env[name];
  if (!v) {
    console.error(`console e2e: environment variable ${name} is required`);
    process.exit(2);
  }
  return v;
}

const BASE = need('IDEM_BASE_URL').replace(/\/+$/, '');
const ADMIN_TOKEN = need('IDEM_ADMIN_TOKEN');
const API_KEY = need('IDEM_API_KEY');
const TENANT = process.env.IDEM_TENANT || 't1';
const IDEM_BIN = need('IDEM_BIN');
const DATABASE_URL = need('IDEM_DATABASE_URL');
const CHROMIUM = process.env.IDEM_CHROMIUM || '/usr/bin/chromium';
const BACKEND =
  process.env.IDEM_E2E_BACKEND || (/^postgres(ql)?:/.test(DATABASE_URL) ? 'postgres' : 'sqlite');
const ARTIFACTS = process.env.IDEM_E2E_ARTIFACTS || '';

const USER = 'U-e2e';
const SHOW = 'S-e2e';
const OPERATOR = 'e2e';
const FREEZE_REASON = 'e2e drill';
// Without "e2e" in it, so the audit row's actor is what shows the operator.
const UNFREEZE_REASON = 'drill finished';
const ESCAPE_KEY = '<script>x</script>';

/** The whole run must finish within this; the step running then is named. */
const RUN_LIMIT_MS = 55_000;
/** Playwright's wait for one element or action. */
const ACTION_MS = 5_000;
/** Playwright's wait for one page load. */
const NAVIGATION_MS = 10_000;
/** How long the key page may take to show the asynchronously recorded arrivals. */
const ARRIVALS_MS = 10_000;

// ---------------------------------------------------------------------------------------
// Steps, failures and screenshots

let browser = null;
let page = null;
let currentStep = '(start)';
let shots = 0;
const dialogs = [];

if (ARTIFACTS) mkdirSync(ARTIFACTS, { recursive: true });

async function screenshot(name) {
  if (!ARTIFACTS || !page) return;
  shots += 1;
  const file = join(ARTIFACTS, `${String(shots).padStart(2, '0')}-${name}.png`);
  try {
    await page.screenshot({ path: file, fullPage: true, timeout: ACTION_MS });
  } catch (e) {
    console.log(`  (screenshot ${file} failed: ${e.message.split('\n')[0]})`);
  }
}

let failing = false;

async function fail(error) {
  if (failing) return;
  failing = true;
  // Whatever the report below waits for, the process ends.
  setTimeout(() => process.exit(1), 10_000).unref();
  console.error(`\nconsole e2e (${BACKEND}): step "${currentStep}" FAILED`);
  console.error(error && error.stack ? error.stack : String(error));
  if (page) {
    try {
      console.error(`\npage URL: ${page.url()}`);
      const html = await page.content();
      console.error(`page content (first 2000 of ${html.length} chars):\n${html.slice(0, 2000)}`);
    } catch (e) {
      console.error(`(could not read the page: ${e.message})`);
    }
    await screenshot(`failed-${currentStep.replace(/[^a-z0-9]+/gi, '-')}`);
  }
  if (browser) await browser.close().catch(() => {});
  process.exit(1);
}

async function step(name, body) {
  currentStep = name;
  const started = Date.now();
  try {
    await body();
  } catch (e) {
    await fail(e);
  }
  console.log(`ok   ${name} (${Date.now() - started} ms)`);
}

const watchdog = setTimeout(() => {
  fail(new Error(`the run took longer than ${RUN_LIMIT_MS / 1000} s`));
}, RUN_LIMIT_MS);

process.on('unhandledRejection', (e) => fail(e));

// ---------------------------------------------------------------------------------------
// Helpers

const url = (path) => `${BASE}${path}`;
const keyPage = (key) => `/console/keys/${encodeURIComponent(TENANT)}/${encodeURIComponent(key)}`;

/** Loads `path` in the browser; the answer's status must be below 400. */
async function open(path) {
  const response = await page.goto(url(path), { waitUntil: 'load' });
  assert.ok(response, `no response for ${path}`);
  assert.ok(response.status() < 400, `GET ${path} answered ${response.status()}`);
  return response;
}

/** Loads `path` in the browser and checks it was redirected (303) to the login page. */
async function expectLoginRedirect(path) {
  const response = await page.goto(url(path), { waitUntil: 'load' });
  assert.ok(response, `no response for ${path}`);
  const landed = new URL(page.url());
  assert.equal(landed.pathname, '/console/login', `GET ${path} without a session landed on ${page.url()}`);
  const first = response.request().redirectedFrom();
  assert.ok(first, `GET ${path} was not redirected`);
  const redirect = await first.response();
  assert.equal(redirect.status(), 303, `GET ${path}: the redirect's status`);
}

/** The console's navigation, on every page. */
async function checkNav() {
  const nav = page.getByRole('navigation', { name: 'Console', exact: true });
  assert.equal(await nav.count(), 1, '<nav aria-label="Console"> on the page');
  for (const name of ['Overview', 'Search', 'Reconcile', 'Freezes', 'Leases', 'Audit']) {
    const n = await nav.getByRole('link', { name, exact: true }).count();
    assert.ok(n >= 1, `nav link "${name}"`);
  }
  const logout = await nav.getByRole('button', { name: 'Log out', exact: true }).count();
  const anywhere = await page.getByRole('button', { name: 'Log out', exact: true }).count();
  assert.ok(logout + anywhere >= 1, '"Log out" button');
}

/**
 * The field labelled `label` within `scope`: by its exact accessible name, else by a name
 * that starts with the label (a <label> wrapped around a <select> adds the selected
 * option to the name: "By key").
 */
async function labelled(scope, label) {
  const exact = scope.getByLabel(label, { exact: true });
  if ((await exact.count()) >= 1) return exact.first();
  const escaped = label.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const loose = scope.getByLabel(new RegExp(`^\\s*${escaped}(\\s|:|$)`));
  assert.ok((await loose.count()) >= 1, `a field labelled "${label}" on ${page.url()}`);
  return loose.first();
}

async function text(selector) {
  const loc = page.locator(selector);
  assert.ok((await loc.count()) >= 1, `element ${selector} on ${page.url()}`);
  return (await loc.first().innerText()).replace(/\s+/g, ' ');
}

/**
 * Clicks `button` (a form's submit button) and waits for the page the browser ends up on
 * (after any redirect) to load. Returns the first answer of that navigation: a POST's own
 * status (a 303, say), not the status of the page it redirects to.
 */
async function submit(button) {
  const main = page.mainFrame();
  const answered = page.waitForResponse((r) => r.request().isNavigationRequest() && r.frame() === main);
  const committed = page.waitForEvent('framenavigated', { predicate: (f) => f === main });
  await button.click();
  const [response] = await Promise.all([answered, committed]);
  await page.waitForLoadState('load');
  return response;
}

async function api(method, path, { token, key, body } = {}) {
  const headers = { authorization: `Bearer ${token}` };
  if (key !== undefined) headers['idempotency-key'] = key;
  if (body !== undefined) headers['content-type'] = 'application/json';
  const r = await fetch(url(path), {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(10_000),
  });
  const raw = await r.text();
  let json = null;
  try {
    json = JSON.parse(raw);
  } catch {}
  return { status: r.status, replayed: r.headers.get('idempotent-replayed') === 'true', json, raw };
}

const order = (key) =>
  api('POST', '/v1/orders', {
    token: API_KEY,
    key,
    body: { user_id: USER, show_id: SHOW, quantity: 1 },
  });

function run(bin, args, timeoutMs) {
  return new Promise((resolve, reject) => {
    execFile(bin, args, { timeout: timeoutMs, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${bin} ${args.join(' ')}: ${error.message}\n${stderr}\n${stdout}`));
      else resolve(stdout);
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------------------
// The run

console.log(`console e2e (${BACKEND}): ${BASE}, Chromium ${CHROMIUM}`);

await step('launch Chromium', async () => {
  // Playwright gives the browser a fresh, empty --user-data-dir of its own (and refuses
  // one in `args`); it removes it on close.
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    timeout: 20_000,
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  page = await context.newPage();
  page.setDefaultTimeout(ACTION_MS);
  page.setDefaultNavigationTimeout(NAVIGATION_MS);
  page.on('dialog', (d) => {
    dialogs.push(`${d.type()}: ${d.message()} (on ${page.url()})`);
    d.dismiss().catch(() => {});
  });
  page.on('pageerror', (e) => console.log(`  (page error on ${page.url()}: ${e.message})`));
});

await step('seed the show', async () => {
  const r = await api('PUT', `/v1/admin/shows/${encodeURIComponent(TENANT)}/${SHOW}`, {
    token: ADMIN_TOKEN,
    body: { title: 'E2E show', capacity: 100, price_cents: 4200 },
  });
  assert.ok(r.status === 200 || r.status === 201, `PUT show answered ${r.status}: ${r.raw}`);
});

await step('no session: /console/ redirects to the login page', async () => {
  const r = await fetch(url('/console/'), { redirect: 'manual', signal: AbortSignal.timeout(10_000) });
  assert.equal(r.status, 303, 'GET /console/ without a session');
  const location = new URL(r.headers.get('location') || '', BASE);
  assert.equal(location.pathname, '/console/login', 'the redirect location');
  await expectLoginRedirect('/console/');
  await screenshot('login');
});

await step('login page form', async () => {
  const name = await labelled(page, 'Your name');
  assert.equal(await name.getAttribute('name'), 'operator', '"Your name" is name=operator');
  const token = await labelled(page, 'Admin token');
  assert.equal(await token.getAttribute('name'), 'token', '"Admin token" is name=token');
  assert.equal(await token.getAttribute('type'), 'password', '"Admin token" is type=password');
  assert.equal(await page.getByRole('button', { name: 'Log in', exact: true }).count(), 1, '"Log in" button');
});

await step('wrong token is refused', async () => {
  await (await labelled(page, 'Your name')).fill(OPERATOR);
  await (await labelled(page, 'Admin token')).fill(`wrong-${randomUUID()}`);
  const response = await submit(page.getByRole('button', { name: 'Log in', exact: true }));
  assert.equal(response.status(), 401, 'the answer to a wrong token');
  const alert = page.getByRole('alert');
  assert.ok((await alert.count()) >= 1, 'an element with role="alert"');
  assert.match(await alert.first().innerText(), /not accepted/, 'the alert text');
  await labelled(page, 'Admin token'); // the login form again
  await screenshot('login-refused');
  await expectLoginRedirect('/console/');
});

await step('log in', async () => {
  await (await labelled(page, 'Your name')).fill(OPERATOR);
  await (await labelled(page, 'Admin token')).fill(ADMIN_TOKEN);
  const response = await submit(page.getByRole('button', { name: 'Log in', exact: true }));
  assert.ok(response.status() < 400, `the login answered ${response.status()}`);
  assert.equal(new URL(page.url()).pathname, '/console/', 'where the login lands');
  assert.equal((await page.locator('h1').first().innerText()).trim(), 'Overview', '<h1> of /console/');
  await checkNav();
  await screenshot('overview');
});

// Eight arrivals of one key: the first executes, the seven after it replay.
const KEY = `e2e-${randomUUID()}`;
let orderId = '';
const counts = { arrivals: 0, executed: 0, replayed: 0, inProgress: 0 };

await step('eight duplicates of one order', async () => {
  const first = await order(KEY);
  counts.arrivals += 1;
  assert.equal(first.status, 201, `the first POST /v1/orders answered ${first.status}: ${first.raw}`);
  assert.equal(first.replayed, false, 'the first answer is not a replay');
  counts.executed += 1;
  orderId = first.json && first.json.order_id;
  assert.ok(orderId, `an order_id in ${first.raw}`);

  const answers = await Promise.all(Array.from({ length: 7 }, () => order(KEY)));
  counts.arrivals += answers.length;
  const seen = [];
  for (let a of answers) {
    // Not expected once the first has finished, but a 409 "in progress" is a correct
    // answer to a concurrent duplicate: resend until it replays.
    for (let tries = 0; a.status === 409 && tries < 20; tries += 1) {
      counts.inProgress += 1;
      await sleep(100);
      a = await order(KEY);
      counts.arrivals += 1;
    }
    assert.equal(a.status, 201, `a duplicate answered ${a.status}: ${a.raw}`);
    assert.equal(a.replayed, true, 'a duplicate carries Idempotent-Replayed: true');
    counts.replayed += 1;
    seen.push(a.json && a.json.order_id);
  }
  for (const id of seen) assert.equal(id, orderId, 'every answer carries the same order_id');
  console.log(`  key ${KEY}, order ${orderId}: ${JSON.stringify(counts)}`);
});

await step('key page shows the arrivals', async () => {
  const want = [`${counts.arrivals} arrivals`, `${counts.executed} executed`, `${counts.replayed} replayed`];
  if (counts.inProgress > 0) want.push(`${counts.inProgress} in progress`);
  const deadline = Date.now() + ARRIVALS_MS;
  let summary = '';
  for (;;) {
    await open(keyPage(KEY));
    summary = (await page.locator('#arrival-summary').count()) ? await text('#arrival-summary') : '';
    if (want.every((w) => summary.includes(w))) break;
    assert.ok(Date.now() < deadline, `#arrival-summary is "${summary}", wanted ${want.join(', ')}`);
    await sleep(500);
  }
  assert.ok((await text('#key-order')).includes(orderId), '#key-order names the order');
  assert.match(await text('#record-state'), /succeeded/, '#record-state');
  await checkNav();
  await screenshot('key');
});

await step('search by order id', async () => {
  await open('/console/search');
  await checkNav();
  const find = await labelled(page, 'Find');
  assert.equal(await find.getAttribute('name'), 'q', '"Find" is name=q');
  const by = await labelled(page, 'By');
  assert.equal(await by.getAttribute('name'), 'by', '"By" is name=by');
  const options = await by.locator('option').evaluateAll((os) => os.map((o) => o.value));
  for (const o of ['key', 'order', 'user', 'show']) assert.ok(options.includes(o), `"By" offers ${o}: ${options}`);
  await find.fill(orderId);
  await by.selectOption('order');
  const answer = await submit(page.getByRole('button', { name: 'Search', exact: true }));
  assert.ok(answer.status() < 400, `the search answered ${answer.status()}`);
  const link = page.getByRole('link', { name: KEY });
  assert.ok((await link.count()) >= 1, `a link whose text contains the key ${KEY}`);
  await screenshot('search');
  await submit(link.first());
  assert.ok((await text('#key-order')).includes(orderId), 'the link leads to the key page');
});

await step('freeze a scope', async () => {
  await open('/console/freezes');
  await checkNav();
  assert.ok((await page.getByText('Freeze a scope').count()) >= 1, '"Freeze a scope" on the page');
  const form = page.locator('form').filter({ has: page.getByRole('button', { name: 'Freeze', exact: true }) });
  assert.equal(await form.count(), 1, 'one form with a "Freeze" button');
  const field = async (label, name) => {
    const f = await labelled(form, label);
    assert.equal(await f.getAttribute('name'), name, `"${label}" is name=${name}`);
    return f;
  };
  const tenant = await field('Tenant', 'tenant');
  if ((await tenant.evaluate((e) => e.tagName)) === 'SELECT') await tenant.selectOption(TENANT);
  else await tenant.fill(TENANT);
  const scope = await field('Scope', 'scope_kind');
  const kinds = await scope.locator('option').evaluateAll((os) => os.map((o) => o.value));
  for (const k of ['user', 'show', 'all']) assert.ok(kinds.includes(k), `"Scope" offers ${k}: ${kinds}`);
  await scope.selectOption('user');
  await (await field('Value', 'scope_value')).fill(USER);
  for (const part of ['payment-confirm', 'ticketing', 'inventory-release']) {
    const box = await field(part, 'what');
    assert.equal(await box.isChecked(), true, `"${part}" is checked by default`);
  }
  const reason = await field('Reason', 'reason');
  assert.notEqual(await reason.getAttribute('required'), null, '"Reason" is required');
  await reason.fill(FREEZE_REASON);
  const response = await submit(form.getByRole('button', { name: 'Freeze', exact: true }));
  assert.ok(response.status() < 400, `the freeze answered ${response.status()}`);
  if (new URL(page.url()).pathname !== '/console/freezes') await open('/console/freezes');
  const rows = page.locator('#active-freezes tr').filter({ hasText: `user:${USER}` }).filter({ hasText: FREEZE_REASON });
  assert.ok((await rows.count()) >= 1, `#active-freezes has a row with user:${USER} and "${FREEZE_REASON}"`);
  const active = await text('#active-freezes');
  for (const part of ['payment-confirm', 'ticketing', 'inventory-release']) {
    assert.ok(active.includes(part), `#active-freezes lists ${part}`);
  }
  await screenshot('frozen');
});

await step('unfreeze it', async () => {
  const group = page.locator('#active-freezes tbody').filter({ hasText: `user:${USER}` });
  // The unfreeze form of the user:U-e2e group when it is inside the table, else the
  // page's (this database has no other active freeze).
  const input = await labelled((await group.count()) ? group : page, 'Reason to unfreeze').catch(() =>
    labelled(page, 'Reason to unfreeze'),
  );
  await input.fill(UNFREEZE_REASON);
  const form = input.locator('xpath=ancestor::form[1]');
  const response = await submit(form.getByRole('button', { name: 'Unfreeze', exact: true }));
  assert.ok(response.status() < 400, `the unfreeze answered ${response.status()}`);
  if (new URL(page.url()).pathname !== '/console/freezes') await open('/console/freezes');
  const active = (await page.locator('#active-freezes').count()) ? await text('#active-freezes') : '';
  assert.ok(!active.includes(`user:${USER}`), `#active-freezes still lists user:${USER}: "${active}"`);
  assert.ok((await text('#freeze-history')).includes(`user:${USER}`), `#freeze-history lists user:${USER}`);
  await screenshot('unfrozen');
});

await step('reconcile the demo incident (dry run)', async () => {
  const out = await run(IDEM_BIN, ['demo', 'incident', '--database-url', DATABASE_URL, '--json'], 30_000);
  const report = JSON.parse(out);
  const legacy = report.legacy;
  assert.ok(legacy && legacy.orders >= 2, `the demo made duplicates on tenant legacy: ${out.slice(0, 500)}`);
  console.log(`  demo incident: ${legacy.orders} legacy orders, ids like ${legacy.order_ids[0]}`);
  await open(`/console/reconcile?tenant=legacy`);
  await checkNav();
  const clusters = page.locator('.cluster');
  assert.ok((await clusters.count()) >= 1, 'at least one .cluster');
  const cluster = clusters.first();
  assert.ok((await cluster.locator('.keeper').count()) >= 1, '.keeper in the cluster');
  const keeper = (await cluster.locator('.keeper').first().innerText()).trim();
  // The id format of the demo's orders (ord_…): its letters before the first _ or -.
  const prefix = ((legacy.order_ids[0] || 'ord').match(/^[A-Za-z]+/) || ['ord'])[0];
  const id = keeper.match(new RegExp(`${prefix}[A-Za-z0-9_-]+`));
  assert.ok(id, `.keeper "${keeper}" names an order id (like ${legacy.order_ids[0]})`);
  const rows = cluster.locator('.cluster-orders tbody tr');
  assert.equal(await rows.count(), legacy.orders, `.cluster-orders has one row per legacy order`);
  const keeperRows = rows.filter({ hasText: 'keeper' });
  assert.equal(await keeperRows.count(), 1, 'exactly one row says "keeper"');
  assert.ok((await keeperRows.first().innerText()).includes(id[0]), `the keeper row is ${id[0]}`);
  assert.ok((await page.locator('#plan tbody tr').count()) >= 1, '#plan lists actions');
  assert.ok((await page.locator('#checks li').count()) >= 1, '#checks lists checks');
  await screenshot('reconcile');
});

await step('audit lists the freeze and the unfreeze', async () => {
  await open('/console/audit');
  await checkNav();
  // An entry is a table row or a list item; the actor must show beside the scope
  // (user:U-e2e) and the reason ("e2e drill"), which contain "e2e" themselves.
  const entries = page.locator('tr, li');
  const actorShown = (t) =>
    new RegExp(`(^|[^\\w-])${OPERATOR}([^\\w-]|$)`).test(t.replaceAll(FREEZE_REASON, ' ').replaceAll(USER, ' '));
  const freeze = entries.filter({ hasText: FREEZE_REASON }).filter({ hasNotText: UNFREEZE_REASON });
  assert.ok((await freeze.count()) >= 1, `an audit entry with "${FREEZE_REASON}"`);
  const freezeText = await freeze.first().innerText();
  assert.ok(actorShown(freezeText), `the freeze entry names the actor ${OPERATOR}: "${freezeText}"`);
  assert.match(freezeText, /freeze/i, 'the entry is a freeze');
  const unfreeze = entries.filter({ hasText: UNFREEZE_REASON });
  assert.ok((await unfreeze.count()) >= 1, `an audit entry with "${UNFREEZE_REASON}"`);
  const unfreezeText = await unfreeze.first().innerText();
  assert.ok(actorShown(unfreezeText), `the unfreeze entry names the actor ${OPERATOR}: "${unfreezeText}"`);
  assert.match(unfreezeText, /unfreeze/i, 'the entry is an unfreeze');
  await screenshot('audit');
});

await step('a key with markup is shown as text', async () => {
  const r = await order(ESCAPE_KEY);
  assert.equal(r.status, 201, `POST /v1/orders with key ${ESCAPE_KEY} answered ${r.status}: ${r.raw}`);
  await open(keyPage(ESCAPE_KEY));
  const h1 = await page.locator('h1').first().innerText();
  assert.ok(h1.includes(ESCAPE_KEY), `<h1> "${h1}" shows ${ESCAPE_KEY} literally`);
  const injected = await page.evaluate(() => [...document.scripts].filter((s) => s.textContent === 'x').length);
  assert.equal(injected, 0, 'no <script>x</script> element in the page');
  await screenshot('escaped-key');
  assert.deepEqual(dialogs, [], 'no dialog opened');
});

await step('pages fit a phone and the keyboard reaches the nav', async () => {
  await page.setViewportSize({ width: 390, height: 844 });
  for (const path of ['/console/', keyPage(KEY), '/console/freezes', '/console/reconcile?tenant=legacy', '/console/leases']) {
    await open(path);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 1, `${path} is ${overflow} px wider than a 390 px screen`);
  }
  await screenshot('phone-key');
  await page.setViewportSize({ width: 1280, height: 900 });
  await open('/console/');
  // Tab from the top: the first stops are the brand link and the nav's links.
  const reached = [];
  for (let i = 0; i < 4; i++) {
    await page.keyboard.press('Tab');
    reached.push(await page.evaluate(() => document.activeElement && document.activeElement.textContent.trim()));
  }
  assert.ok(reached.includes('Overview') && reached.includes('Search'), `Tab reaches the nav: ${reached}`);
});

await step('log out', async () => {
  await open('/console/');
  await submit(page.getByRole('button', { name: 'Log out', exact: true }).first());
  await expectLoginRedirect('/console/');
  await screenshot('logged-out');
});

// The standalone console (`idem console`) on the same database, when the test started
// one: a fresh browser context (cookies ignore ports), its own login, the key the
// duplicates above made, and no page of the order service.
const STANDALONE = (process.env.IDEM_STANDALONE_URL || '').replace(/\/+$/, '');
if (STANDALONE) {
  const at = (path) => `${STANDALONE}${path}`;
  const go = async (path) => {
    const response = await page.goto(at(path), { waitUntil: 'load' });
    assert.ok(response && response.status() < 400, `GET ${at(path)} answered ${response && response.status()}`);
  };
  await step('standalone console: log in', async () => {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    page = await context.newPage();
    page.setDefaultTimeout(ACTION_MS);
    page.setDefaultNavigationTimeout(NAVIGATION_MS);
    await page.goto(at('/console/'), { waitUntil: 'load' });
    assert.equal(new URL(page.url()).pathname, '/console/login', 'no session: the login page');
    await (await labelled(page, 'Your name')).fill(OPERATOR);
    await (await labelled(page, 'Admin token')).fill(ADMIN_TOKEN);
    const response = await submit(page.getByRole('button', { name: 'Log in', exact: true }));
    assert.ok(response.status() < 400, `the login answered ${response.status()}`);
    assert.equal((await page.locator('h1').first().innerText()).trim(), 'Overview', '<h1> of /console/');
    const nav = page.getByRole('navigation', { name: 'Console', exact: true });
    for (const name of ['Overview', 'Search', 'Leases', 'Audit']) {
      assert.ok((await nav.getByRole('link', { name, exact: true }).count()) >= 1, `nav link "${name}"`);
    }
    for (const name of ['Reconcile', 'Freezes']) {
      assert.equal(await nav.getByRole('link', { name, exact: true }).count(), 0, `no nav link "${name}"`);
    }
    await screenshot('standalone-overview');
  });
  await step('standalone console: the key page', async () => {
    await go(keyPage(KEY));
    assert.equal((await text('#record-state')).trim(), 'succeeded', 'the record state');
    assert.ok((await text('#stored-body')).includes(orderId), 'the stored body names the order');
    await screenshot('standalone-key');
  });
  await step('standalone console: search by key prefix', async () => {
    await go(`/console/search?by=key&q=${encodeURIComponent(KEY.slice(0, 12))}&tenant=${encodeURIComponent(TENANT)}`);
    const link = page.locator(`#results a[href="${keyPage(KEY)}"]`);
    assert.equal(await link.count(), 1, 'the key among the results');
  });
  await step('standalone console: leases, audit, log out', async () => {
    await go('/console/leases');
    await go('/console/audit');
    assert.ok((await text('#audit')).includes(OPERATOR), 'the login in the audit');
    await submit(page.getByRole('button', { name: 'Log out', exact: true }).first());
    assert.equal(new URL(page.url()).pathname, '/console/login', 'logged out');
  });
}

clearTimeout(watchdog);
await browser.close();
assert.deepEqual(dialogs, [], 'no dialog opened');
console.log(`console e2e: all steps passed (${BACKEND})`);
