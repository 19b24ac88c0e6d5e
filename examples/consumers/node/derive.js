'use strict';
// The id relayd derives for a legacy AMQP message without a message-id:
// relayd backfill puts it in the Relay-Derived-Id header of the JetStream
// copy, and the Go inbox computes it for the queue's copy. The Go source is
// the spec (backfill.DeriveID); inbox/testdata/derived-ids.json holds test
// vectors. What amqplib decodes lossily gets another id than in Go: a header
// string that is not UTF-8, an int64 beyond 2^53, a double that is exactly a
// float32 (taken for a float: 1.100000023841858 hashes as 1.1).
const { createHash } = require('node:crypto');

// Headers RabbitMQ adds on the way: not part of the message.
const BROKER_HEADERS = new Set(['x-delivery-count', 'x-death', 'x-first-death-exchange', 'x-first-death-queue',
  'x-first-death-reason', 'x-last-death-exchange', 'x-last-death-queue', 'x-last-death-reason', 'x-received-from']);

// deriveId(msg) takes an amqplib message: { fields, properties, content }.
function deriveId({ fields, properties: p, content }) {
  const h = createHash('sha256');
  const field = (v) => {
    const b = Buffer.isBuffer(v) ? v : Buffer.from(v ?? '', 'utf8');
    h.update(`${b.length}:`).update(b).update(';');
  };
  field(fields.routingKey);
  field(p.timestamp === undefined ? '' : rfc3339(p.timestamp));
  field(p.type);
  field(p.correlationId);
  field(p.contentType);
  const headers = p.headers ?? {};
  for (const k of byteOrder(Object.keys(headers).filter((k) => !BROKER_HEADERS.has(k)))) {
    field(k);
    field(headerValue(headers[k]));
  }
  field(content);
  const u = h.digest().subarray(0, 16);
  u[6] = (u[6] & 0x0f) | 0x80; // version 8
  u[8] = (u[8] & 0x3f) | 0x80; // variant 10
  const s = u.toString('hex');
  return `${s.slice(0, 8)}-${s.slice(8, 12)}-${s.slice(12, 16)}-${s.slice(16, 20)}-${s.slice(20)}`;
}

// A header's value as Go's backfill.headerValue writes it: strings and
// bytes as they are, a timestamp in RFC 3339, nothing as "", the rest JSON.
function headerValue(v) {
  if (typeof v === 'string' || Buffer.isBuffer(v)) return v;
  if (v === null || v === undefined) return '';
  if (v['!'] === 'timestamp') return rfc3339(v.value);
  if (typeof v === 'number' && !Number.isFinite(v)) return Number.isNaN(v) ? 'NaN' : v > 0 ? '+Inf' : '-Inf';
  return goJSON(v);
}

// goJSON is Go's json.Marshal of the value amqp091-go decodes: maps with
// sorted keys, <, > and & escaped, []byte in base64.
function goJSON(v) {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'boolean') return String(v);
  if (typeof v === 'number') return goNumber(v);
  if (typeof v === 'string') return goString(v);
  if (Buffer.isBuffer(v)) return `"${v.toString('base64')}"`;
  if (Array.isArray(v)) return v.length === 0 ? 'null' : `[${v.map(goJSON).join(',')}]`; // amqp091-go: nil
  if (v['!'] === 'timestamp') return `"${rfc3339(v.value)}"`;
  if (v['!'] === 'decimal') return `{"Scale":${v.value.places},"Value":${v.value.digits | 0}}`;
  return `{${byteOrder(Object.keys(v)).map((k) => `${goString(k)}:${goJSON(v[k])}`).join(',')}}`;
}

function goString(s) {
  return JSON.stringify(s).replace(/[<>&\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

// goNumber formats a number as Go does. amqplib decodes a float, a double
// and an int alike: a number exactly a float32 is taken for a float, unless
// it is an integer below 2^53.
function goNumber(v) {
  if (Object.is(v, -0)) return '-0';
  if (Number.isSafeInteger(v) || Math.fround(v) !== v) return String(v); // exponents as Go writes them: 1e-7, 1e+21
  for (let p = 1; p <= 9; p++) {
    const short = Number(v.toPrecision(p));
    if (Math.fround(short) === v) return String(short);
  }
  return String(v);
}

function rfc3339(seconds) {
  return new Date(seconds * 1000).toISOString().replace('.000Z', 'Z');
}

// byteOrder sorts strings as Go's sort.Strings does: by their UTF-8 bytes.
function byteOrder(keys) {
  return keys.sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
}

module.exports = { deriveId, headerValue };
