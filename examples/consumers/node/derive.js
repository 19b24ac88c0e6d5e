'use strict';
// The id relayd derives for a legacy AMQP message without a message-id, as
// docs/message-ids.md specifies it; the Go implementation is internal/msgid,
// the test vectors are inbox/testdata/derived-ids.json. relayd backfill puts
// it in the Relay-Derived-Id header of the JetStream copy, and the Go inbox
// computes it for the queue's copy.
//
// amqplib decodes some messages otherwise than amqp091-go, and deriveId then
// returns '' rather than an id that may differ from Go's: a whole number
// beyond 2^53 (an int64 it rounded?), a number that Go writes otherwise as a
// float (32 bits) than as a double or an int, NaN or an infinity in a table
// or array, a timestamp outside the years 1970-9999, text with U+FFFD (bytes
// that are not UTF-8), a field named __proto__ that holds a table, array,
// bytes, timestamp, decimal or void (amqplib makes it the object's
// prototype). Undetectable, so not handled: a string, number or boolean
// named __proto__ (amqplib drops it), and a table whose keys are '!' and
// 'value' (amqplib's own form of a timestamp or decimal).
const { createHash } = require('node:crypto');

// Headers RabbitMQ adds on the way: not part of the message.
const BROKER_HEADERS = new Set(['x-delivery-count', 'x-death', 'x-first-death-exchange', 'x-first-death-queue',
  'x-first-death-reason', 'x-last-death-exchange', 'x-last-death-queue', 'x-last-death-reason', 'x-received-from']);

class Lossy extends Error {} // amqplib did not decode the message as amqp091-go does
const lossy = (why) => { throw new Lossy(why); };

// deriveId(msg) takes an amqplib message: { fields, properties, content }.
// It returns '' when it cannot derive the id Go derives.
function deriveId(msg) {
  try {
    return derive(msg);
  } catch (err) {
    if (err instanceof Lossy) return '';
    throw err;
  }
}

function derive({ fields, properties: p, content }) {
  const h = createHash('sha256');
  const field = (v) => {
    if (typeof v === 'string' && v.includes('\uFFFD')) lossy('not UTF-8');
    const b = Buffer.isBuffer(v) ? v : Buffer.from(v ?? '', 'utf8');
    h.update(`${b.length}:`).update(b).update(';');
  };
  field(fields.routingKey);
  field(p.timestamp === undefined ? '' : rfc3339(p.timestamp));
  field(p.type);
  field(p.correlationId);
  field(p.contentType);
  const headers = p.headers ?? {};
  for (const k of tableKeys(headers).filter((k) => !BROKER_HEADERS.has(k))) {
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

// A header's value as Go's msgid.HeaderValue writes it: strings and bytes
// as they are, a timestamp in RFC 3339, nothing as "", the rest JSON.
function headerValue(v) {
  if (typeof v === 'string' || Buffer.isBuffer(v)) return v;
  if (v === null || v === undefined) return '';
  if (tag(v) === 'timestamp') return rfc3339(v.value);
  if (typeof v === 'number' && !Number.isFinite(v)) return Number.isNaN(v) ? 'NaN' : v > 0 ? '+Inf' : '-Inf';
  return goJSON(v);
}

// tag is amqplib's mark of a timestamp or a decimal, its own property '!'.
const tag = (v) => Object.hasOwn(v, '!') && v['!'];

// goJSON is Go's json.Marshal of the value amqp091-go decodes: maps with
// sorted keys, <, > and & escaped, []byte in base64.
function goJSON(v) {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'boolean') return String(v);
  if (typeof v === 'number') return goNumber(v);
  if (typeof v === 'string') return goString(v);
  if (Buffer.isBuffer(v)) return `"${v.toString('base64')}"`;
  if (Array.isArray(v)) return v.length === 0 ? 'null' : `[${v.map(goJSON).join(',')}]`; // amqp091-go: nil
  if (tag(v) === 'timestamp') return `"${rfc3339(v.value)}"`;
  if (tag(v) === 'decimal') return `{"Scale":${v.value.places},"Value":${v.value.digits | 0}}`;
  return `{${tableKeys(v).map((k) => `${goString(k)}:${goJSON(v[k])}`).join(',')}}`;
}

function goString(s) {
  return JSON.stringify(s).replace(/[<>&\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

// goNumber formats a number as Go does, when amqplib's number tells how.
// amqplib decodes an int, a float and a double alike: an int64 beyond 2^53
// is rounded, and a number that is exactly a float32 may have been a float,
// which Go writes as the shortest text for 32 bits (1.1, not
// 1.100000023841858).
function goNumber(v) {
  if (!Number.isFinite(v)) lossy('NaN or an infinity in a table or array'); // Go: no JSON
  if (Object.is(v, -0)) return '-0';
  if (Number.isInteger(v) && !Number.isSafeInteger(v)) lossy(`${v} is beyond 2^53`);
  if (Math.fround(v) === v && float32Text(v) !== String(v)) lossy(`${v} may be a float or not`);
  return String(v); // exponents as Go writes them: 1e-7, 1e+21
}

// float32Text is the shortest text that reads back as the float32 v.
function float32Text(v) {
  for (let p = 1; p < 9; p++) {
    const short = Number(v.toPrecision(p));
    if (Math.fround(short) === v) return String(short);
  }
  return String(Number(v.toPrecision(9)));
}

// rfc3339 is a timestamp of whole seconds as Go writes it, for the years
// JavaScript writes alike.
function rfc3339(seconds) {
  if (!(seconds >= 0 && seconds <= 253402300799)) lossy(`timestamp ${seconds} is beyond the year 9999`);
  return new Date(seconds * 1000).toISOString().replace('.000Z', 'Z');
}

// tableKeys are a decoded table's keys, sorted as Go's sort.Strings does: by
// their UTF-8 bytes. A table named __proto__ in it became its prototype.
function tableKeys(t) {
  if (Object.getPrototypeOf(t) !== Object.prototype) lossy('a table named __proto__');
  return Object.keys(t).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
}

module.exports = { deriveId, headerValue };
