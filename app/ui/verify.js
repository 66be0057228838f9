// Verifying a deletion receipt (a C2SP tlog-proof@v1 file) in the browser, with no key and no
// third-party code: SHA-256 and Ed25519 come from WebCrypto (`el` from dom.js). The checks mirror
// app/core/ledger/tiles.py (verify_tlog_proof, TileHashes, check_extension):
//   1. the certificate (the `extra` line) hashes to the public entry, SHA-256(body), whose
//      leaf hash is SHA-256(0x00 ‖ entry) (RFC 9162 §2.1.1);
//   2. the inclusion proof leads from that leaf at `index` to the checkpoint's root
//      (RFC 9162 §2.1.3.2);
//   3. the checkpoint carries a valid Ed25519 signature by the log key pinned in this page
//      (c2sp.org/signed-note: key id = SHA-256(name ‖ 0x0A ‖ 0x01 ‖ key)[:4]);
//   4. the log's latest checkpoint, signed by the same key, extends it: its public tiles
//      (c2sp.org/tlog-tiles) reproduce both roots, so the older tree is a prefix of the newer.
"use strict";

const HEADER = "c2sp.org/tlog-proof@v1";
const DASH = "\u2014";
const TILE_HEIGHT = 8;
const TILE_WIDTH = 1 << TILE_HEIGHT;
const utf8 = new TextEncoder();

class Failure extends Error {}

// ---- bytes -----------------------------------------------------------------------------------

function fromBase64(text, what) {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text) || text.length % 4 !== 0) {
    throw new Failure(`${what} is not base64`);
  }
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function same(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

async function sha256(...parts) {
  const buffer = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { buffer.set(p, at); at += p.length; }
  return new Uint8Array(await crypto.subtle.digest("SHA-256", buffer));
}

const leafHash = (entry) => sha256(Uint8Array.of(0), entry);
const nodeHash = (left, right) => sha256(Uint8Array.of(1), left, right);

// ---- signed notes and checkpoints -------------------------------------------------------------

async function parseVkey(vkey) {
  const parts = vkey.trim().split("+");
  if (parts.length < 3) throw new Failure("the pinned log key is not a verifier key");
  const [name, id] = parts;
  const raw = fromBase64(parts.slice(2).join("+"), "the pinned log key");
  if (raw.length !== 33 || raw[0] !== 0x01) throw new Failure("the pinned key is not Ed25519");
  const key = raw.slice(1);
  const expected = (await sha256(utf8.encode(`${name}\n`), Uint8Array.of(0x01), key)).slice(0, 4);
  if (hex(expected) !== id.toLowerCase()) throw new Failure("the pinned key's id does not match it");
  return { name, id: id.toLowerCase(), key };
}

function splitNote(note) {
  const at = note.lastIndexOf("\n\n");
  if (at < 0 || !note.endsWith("\n")) throw new Failure("the checkpoint is not a signed note");
  const text = note.slice(0, at + 1);
  const signatures = note.slice(at + 2).split("\n").slice(0, -1).map((line) => {
    const parts = line.split(" ");
    if (parts.length !== 3 || parts[0] !== DASH || !parts[1]) {
      throw new Failure("the checkpoint has a line that is not a signature");
    }
    return { name: parts[1], raw: fromBase64(parts[2], "a signature") };
  });
  if (!signatures.length) throw new Failure("the checkpoint carries no signature");
  return { text, signatures };
}

// The note's text if the pinned key signed it (and every signature of that key verifies).
async function openNote(note, vkey) {
  const { text, signatures } = splitNote(note);
  const mine = signatures.filter((s) => s.name === vkey.name && hex(s.raw.slice(0, 4)) === vkey.id);
  if (!mine.length) {
    const names = [...new Set(signatures.map((s) => s.name))].join(", ");
    throw new Failure(`the checkpoint is not signed by this log's key (signed by: ${names})`);
  }
  const key = await crypto.subtle.importKey("raw", vkey.key, { name: "Ed25519" }, false, ["verify"]);
  for (const s of mine) {
    const ok = s.raw.length === 68 &&
      await crypto.subtle.verify({ name: "Ed25519" }, key, s.raw.slice(4), utf8.encode(text));
    if (!ok) throw new Failure("the log's signature on the checkpoint does not verify");
  }
  return { text, others: signatures.length - mine.length };
}

function parseCheckpoint(text) {
  const lines = text.split("\n");
  if (lines.length < 4 || !lines[0] || !/^(0|[1-9][0-9]*)$/.test(lines[1])) {
    throw new Failure("the checkpoint's origin or size does not parse");
  }
  const root = fromBase64(lines[2], "the checkpoint's root");
  if (root.length !== 32) throw new Failure("the checkpoint's root is not a SHA-256 hash");
  return { origin: lines[0], size: Number(lines[1]), root };
}

function parseProof(text) {
  const at = text.indexOf("\n\n");
  const head = at < 0 ? [] : text.slice(0, at).split("\n");
  if (head[0] !== HEADER) throw new Failure(`this is not a ${HEADER} file`);
  let line = 1;
  let extra = new Uint8Array();
  if (head[line] && head[line].startsWith("extra ")) {
    extra = fromBase64(head[line].slice(6), "the certificate");
    line += 1;
  }
  const index = head[line] && head[line].startsWith("index ") ? head[line].slice(6) : "";
  if (!/^(0|[1-9][0-9]*)$/.test(index)) throw new Failure("the receipt names no entry index");
  const path = head.slice(line + 1).map((h) => fromBase64(h, "a proof hash"));
  return { extra, index: Number(index), path, note: text.slice(at + 2) };
}

// ---- Merkle proofs ---------------------------------------------------------------------------

async function verifyInclusion(leaf, index, size, path, root) {
  if (!(index >= 0 && index < size)) return false;
  let fn = index, sn = size - 1, r = leaf;
  for (const p of path) {
    if (sn === 0) return false;
    if (fn % 2 === 1 || fn === sn) {
      r = await nodeHash(p, r);
      if (fn % 2 === 0) {
        while (fn !== 0 && fn % 2 === 0) { fn = Math.floor(fn / 2); sn = Math.floor(sn / 2); }
      }
    } else {
      r = await nodeHash(r, p);
    }
    fn = Math.floor(fn / 2); sn = Math.floor(sn / 2);
  }
  return sn === 0 && same(r, root);
}

function encodeIndex(n) {
  let digits = String(n);
  digits = "0".repeat((3 - (digits.length % 3)) % 3) + digits;
  const groups = digits.match(/.{3}/g);
  return [...groups.slice(0, -1).map((g) => `x${g}`), groups[groups.length - 1]].join("/");
}

// Any subtree hash of a tree of `size` leaves from the log's public hash tiles.
class TileHashes {
  constructor(size) { this.size = size; this.tiles = new Map(); }

  async tile(level, index) {
    const id = `${level}/${index}`;
    if (!this.tiles.has(id)) {
      const complete = Math.floor(this.size / 2 ** (TILE_HEIGHT * level));
      const width = Math.max(0, Math.min(TILE_WIDTH, complete - index * TILE_WIDTH));
      const partial = width === TILE_WIDTH ? "" : `.p/${width}`;
      const response = await fetch(`/log/tile/${level}/${encodeIndex(index)}${partial}`);
      if (!response.ok) throw new Failure(`the log did not serve tile ${id} (${response.status})`);
      const data = new Uint8Array(await response.arrayBuffer());
      if (data.length !== 32 * width) throw new Failure(`tile ${id} has the wrong size`);
      this.tiles.set(id, data);
    }
    return this.tiles.get(id);
  }

  async node(height, index) {
    const level = Math.floor(height / TILE_HEIGHT), within = height % TILE_HEIGHT;
    const first = index * 2 ** within;
    const data = await this.tile(level, Math.floor(first / TILE_WIDTH));
    const at = first % TILE_WIDTH;
    let row = [];
    for (let i = at; i < at + 2 ** within; i++) row.push(data.slice(32 * i, 32 * (i + 1)));
    while (row.length > 1) {
      const next = [];
      for (let i = 0; i < row.length; i += 2) next.push(await nodeHash(row[i], row[i + 1]));
      row = next;
    }
    return row[0];
  }

  async subtree(start, end) {
    const n = end - start;
    if ((n & (n - 1)) === 0 && start % n === 0) return this.node(Math.log2(n), start / n);
    let k = 1;
    while (k * 2 < n) k *= 2;
    return nodeHash(await this.subtree(start, start + k), await this.subtree(start + k, end));
  }
}

// That `latest` extends `old`: the tiles give latest's root and, from the same leaves, old's.
async function extendsCheckpoint(old, latest) {
  if (latest.origin !== old.origin) throw new Failure("the latest checkpoint is of another log");
  if (latest.size < old.size) throw new Failure(`the log shrank from ${old.size} to ${latest.size} entries`);
  if (latest.size === old.size) {
    if (!same(latest.root, old.root)) throw new Failure("the log has two roots for one size: it forked");
    return;
  }
  const tiles = new TileHashes(latest.size);
  if (!same(await tiles.subtree(0, latest.size), latest.root)) {
    throw new Failure("the log's tiles do not reproduce its latest checkpoint");
  }
  if (!same(await tiles.subtree(0, old.size), old.root)) {
    throw new Failure("the log's entries up to your checkpoint changed since: it was rewritten");
  }
}

// ---- the page --------------------------------------------------------------------------------

function describe(body) {
  try {
    const c = JSON.parse(new TextDecoder().decode(body));
    const parts = [`model ${c.model_id}`, `version ${c.from_version} → ${c.to_version}`];
    if (c.guarantee) parts.push(`guarantee ${c.guarantee}`);
    // 6 significant figures (a composed ε comes out as 1.000000000001); the file has them all
  const figure = x => typeof x === "number" ? String(Number(x.toPrecision(6))) : String(x);
  if (c.epsilon !== undefined) parts.push(`ε = ${figure(c.epsilon)}`, `δ = ${figure(c.delta)}`);
    return { certificate: c, summary: parts.join(", ") };
  } catch (_) {
    return { certificate: null, summary: "a certificate that is not JSON" };
  }
}

async function verify(text, vkey) {
  const proof = parseProof(text);
  const opened = await openNote(proof.note, vkey);
  const checkpoint = parseCheckpoint(opened.text);
  if (checkpoint.origin !== vkey.name) throw new Failure(`the checkpoint is for ${checkpoint.origin}`);
  const leaf = await leafHash(await sha256(proof.extra));
  if (!await verifyInclusion(leaf, proof.index, checkpoint.size, proof.path, checkpoint.root)) {
    throw new Failure("the inclusion proof does not lead to the checkpoint's root: the " +
      "certificate or the proof is not what the log signed");
  }
  const response = await fetch("/log/checkpoint", { cache: "no-store" });
  if (!response.ok) throw new Failure(`the log did not serve its latest checkpoint (${response.status})`);
  const latest = parseCheckpoint((await openNote(await response.text(), vkey)).text);
  await extendsCheckpoint(checkpoint, latest);
  return { proof, checkpoint, latest, cosignatures: opened.others, ...describe(proof.extra) };
}

function show(node) {
  const result = document.getElementById("result");
  result.replaceChildren(node);
}

function proven(r, vkey) {
  const sentence = `Proven: this certificate (${r.summary}) is entry ${r.proof.index} of the ` +
    `public log ${r.checkpoint.origin}, under a checkpoint of ${r.checkpoint.size} entries ` +
    `signed by the log's key ${vkey.id}, and the log's latest checkpoint ` +
    `(${r.latest.size} entries) still contains it unchanged.`;
  const limits = "Not proven: that the update was computed as the certificate says (an " +
    "auditor's job), that the pinned key is the log's (compare its id with one the " +
    `operator publishes elsewhere)${r.cosignatures ? `, or the ${r.cosignatures} witness ` +
    "cosignature(s), whose keys this page does not pin" : ""}.`;
  const rows = r.certificate ? Object.entries(r.certificate)
    .filter(([, v]) => v === null || typeof v !== "object")
    .map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, String(v)))) : [];
  return el("div", { class: "card verified", "data-verdict": "verified" },
    el("p", { class: "verdict good" }, "✓ Verified"),
    el("p", { class: "sentence", id: "proven" }, sentence),
    el("p", { class: "sentence notice", id: "limits" }, limits),
    rows.length ? el("table", { id: "certificate" }, rows) : null);
}

function refused(message) {
  return el("div", { class: "card refused", "data-verdict": "refused" },
    el("p", { class: "verdict error" }, "✗ Not verified"),
    el("p", { class: "sentence", id: "proven" }, `Nothing was proven: ${message}.`),
    el("p", { class: "sentence notice", id: "next" }, "What to do: check that this is the " +
      "receipt file exactly as you received it (a copy that was edited, re-encoded or cut " +
      "short does not verify), or download it again from the service (the dashboard's " +
      "Deletions page, or GET /v1/deletions/{request}/tlog-proofs/{certificate} with the key " +
      "that asked for the deletion). If a receipt that the service " +
      "gives you still does not verify, report it to the service's operator and keep the " +
      "file: it is evidence."));
}

const MAX_RECEIPT = 1 << 20;

async function check(name, size, read, vkeyPromise) {
  show(el("p", { class: "notice" }, `Checking ${name}…`));
  try {
    if (size > MAX_RECEIPT) throw new Failure("the receipt is larger than any receipt (1 MiB)");
    const vkey = await vkeyPromise;
    show(proven(await verify(await read(), vkey), vkey));
  } catch (error) {
    show(refused(error instanceof Failure ? error.message : `the check failed (${error})`));
  }
}

const checkFile = (file, vkeyPromise) => check(file.name, file.size, () => file.text(), vkeyPromise);

function start() {
  const pinned = document.querySelector('meta[name="lethe-log-vkey"]').content;
  document.getElementById("vkey").textContent = pinned;
  const vkeyPromise = parseVkey(pinned);
  vkeyPromise.catch(() => {});
  const input = document.getElementById("receipt");
  input.addEventListener("change", () => { if (input.files.length) checkFile(input.files[0], vkeyPromise); });
  // or pasted: the text of the .tlog-proof file
  const pasted = document.getElementById("pasted");
  document.getElementById("check-pasted").addEventListener("click", () => {
    const text = pasted.value.replace(/\r\n/g, "\n");
    check("the pasted receipt", text.length, async () => text.endsWith("\n") ? text : `${text}\n`,
          vkeyPromise);
  });
  const drop = document.getElementById("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files.length) checkFile(e.dataTransfer.files[0], vkeyPromise);
  });
}

document.addEventListener("DOMContentLoaded", start);
