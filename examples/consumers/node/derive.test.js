'use strict';
// deriveId against the test vectors the Go implementation pins
// (inbox/testdata/derived-ids.json, format in docs/message-ids.md). Each
// vector's headers go through amqplib's own field-table codec, so deriveId
// sees them as a real delivery gives them.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { deriveId } = require('./derive');

const codec = require(path.join(path.dirname(require.resolve('amqplib')), 'lib', 'codec.js'));
const vectorsFile = path.join(__dirname, '..', '..', '..', 'inbox', 'testdata', 'derived-ids.json');

const intTypes = { b: 'int8', B: 'uint8', s: 'int16', u: 'uint16', I: 'int32', i: 'uint32', l: 'int64' };
const floats = { NaN: NaN, '+Inf': Infinity, '-Inf': -Infinity };

// encodable is a vector's typed header value as amqplib's encoder takes it.
function encodable({ type, amqp, value }) {
  switch (type) {
    case 'string': return { '!': 'string', value };
    case 'bytes': return Buffer.from(value, 'base64');
    case 'int': return { '!': intTypes[amqp], value: amqp === 'l' ? value : Number(value) };
    case 'float': return { '!': amqp === 'f' ? 'float' : 'double', value: floats[value] ?? value };
    case 'bool': return value;
    case 'timestamp': return { '!': 'timestamp', value: Date.parse(value) / 1000 };
    case 'null': return null;
    case 'decimal': return { '!': 'decimal', value: { places: value.scale, digits: value.value >>> 0 } };
    case 'table': return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, encodable(v)]));
    case 'array': return value.map(encodable);
    default: throw new Error(`unknown header type ${type}`);
  }
}

// decoded is a table as amqplib decodes it from the wire: an object of
// typed values as amqplib's encoder takes them, or a table's raw bytes.
function decoded(table) {
  if (Buffer.isBuffer(table)) return codec.decodeFields(table);
  const buf = Buffer.alloc(1 << 20);
  const n = codec.encodeTable(buf, table, 0);
  return codec.decodeFields(buf.subarray(4, n));
}

// raw is the bytes of a field table, written in hex.
const raw = (hex) => Buffer.from(hex.replace(/ /g, ''), 'hex');

// message is an amqplib delivery with these properties and an empty body.
const message = (properties) => ({ fields: { routingKey: '' }, properties, content: Buffer.alloc(0) });

// delivery is the message amqplib gives for a vector.
function delivery(v) {
  return {
    fields: { routingKey: v.routing_key },
    properties: {
      timestamp: v.timestamp ? Date.parse(v.timestamp) / 1000 : undefined,
      type: v.type || undefined, correlationId: v.correlation_id || undefined, contentType: v.content_type || undefined,
      headers: decoded(encodable({ type: 'table', value: v.headers })),
    },
    content: Buffer.from(v.body_base64, 'base64'),
  };
}

// float32Text is the shortest text that reads back as the float32 v, as Go
// writes a float.
function float32Text(v) {
  for (let p = 1; ; p++) if (Math.fround(Number(v.toPrecision(p))) === v) return String(Number(v.toPrecision(p)));
}

// lossy says why amqplib cannot give a header's value as amqp091-go does, or
// "": it decodes ints, floats and doubles alike into JavaScript numbers, so
// one beyond 2^53 or one Go writes otherwise as a float (32 bits) is lost,
// and so is NaN or an infinity inside a table or array (Go writes no JSON).
function lossy(h, nested) {
  if (h.type === 'int' || h.type === 'float') {
    const n = Number(floats[h.value] ?? h.value);
    const got = h.amqp === 'f' ? Math.fround(n) : n; // what amqplib decodes
    if (!Number.isFinite(got)) return nested ? `${h.value} in a table or array` : '';
    if (Number.isInteger(got) && !Number.isSafeInteger(got)) return `${h.value} is beyond 2^53`;
    if (Math.fround(got) === got && float32Text(got) !== String(got)) return `${h.value} may be a float or not`;
  }
  const inside = h.type === 'table' ? Object.values(h.value) : h.type === 'array' ? h.value : [];
  return inside.map((v) => lossy(v, true)).find((r) => r) ?? '';
}

const vectors = JSON.parse(fs.readFileSync(vectorsFile, 'utf8'));

test('the vectors file has vectors', () => assert.ok(vectors.length > 0, vectorsFile));

// A vector amqplib cannot decode as amqp091-go does gets no id here: the
// consumer rejects the message, rather than handle it under another id.
for (const v of vectors) {
  const why = Object.values(v.headers).map((h) => lossy(h, false)).find((r) => r);
  if (why) {
    test(`${v.name}: no id in Node (${why})`, () => assert.equal(deriveId(delivery(v)), ''));
  } else {
    test(v.name, () => assert.equal(deriveId(delivery(v)), v.id));
  }
}

test('no id: a float (32 bits) beyond 2^24 that Go writes otherwise', () => {
  // 123456789 as a float is 123456792: Go writes 1.2345679e+08, an int 123456792.
  assert.equal(deriveId(message({ headers: decoded({ x: { '!': 'float', value: 123456789 } }) })), '');
  // 1e8 is a float and an int alike: it keeps its id.
  const float = deriveId(message({ headers: decoded({ x: { '!': 'float', value: 1e8 } }) }));
  assert.equal(float, deriveId(message({ headers: decoded({ x: { '!': 'int32', value: 1e8 } }) })));
  assert.notEqual(float, '');
});

test('no id: a timestamp beyond the year 9999, as one in milliseconds', () => {
  assert.equal(deriveId(message({ timestamp: 1700000000000 })), '');
  assert.equal(deriveId(message({ headers: decoded({ at: { '!': 'timestamp', value: 1700000000000 } }) })), '');
  assert.equal(deriveId(message({ headers: decoded({ t: { at: { '!': 'timestamp', value: 1700000000000 } } }) })), '');
  assert.notEqual(deriveId(message({ timestamp: 253402300799 })), '');
});

test('no id: NaN or an infinity in a table or array', () => {
  assert.equal(deriveId(message({ headers: decoded({ t: { x: { '!': 'double', value: NaN } } }) })), '');
  assert.equal(deriveId(message({ headers: decoded({ a: [{ '!': 'double', value: -Infinity }] }) })), '');
});

test('no id: text that is not UTF-8 (U+FFFD)', () => {
  assert.equal(deriveId(message({ headers: decoded(raw('01 73 53 00000002 61ff')) })), ''); // s: S "a\xff"
  assert.equal(deriveId(message({ headers: decoded(raw('02 6bff 74 01')) })), ''); // "k\xff": t true
  assert.equal(deriveId(message({ headers: decoded({ t: { s: 'a\uFFFD' } }) })), '');
  assert.equal(deriveId(message({ type: 'a\uFFFD' })), '');
  assert.equal(deriveId({ ...message({}), fields: { routingKey: 'a\uFFFD' } }), '');
});

test('no id: a table named __proto__, which amqplib makes the prototype', () => {
  const proto = '09 5f5f70726f746f5f5f 46 00000004 0161 74 01'; // __proto__: F {a: t true}
  assert.equal(deriveId(message({ headers: decoded(raw(proto)) })), '');
  assert.equal(deriveId(message({ headers: decoded(raw(`01 74 46 00000013 ${proto}`)) })), ''); // t: F {...}
});
