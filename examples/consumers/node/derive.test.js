'use strict';
// deriveId against the test vectors the Go implementation pins
// (inbox/testdata/derived-ids.json, format in docs/message-ids.md). Each
// vector's headers go through amqplib's own field-table codec, so deriveId
// sees them as a real delivery gives them.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { deriveId, headerValue } = require('./derive');

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

// delivery is the message amqplib gives for a vector.
function delivery(v) {
  const buf = Buffer.alloc(1 << 20);
  const n = codec.encodeTable(buf, encodable({ type: 'table', value: v.headers }), 0);
  return {
    fields: { routingKey: v.routing_key },
    properties: {
      timestamp: v.timestamp ? Date.parse(v.timestamp) / 1000 : undefined,
      type: v.type || undefined, correlationId: v.correlation_id || undefined, contentType: v.content_type || undefined,
      headers: codec.decodeFields(buf.subarray(4, n)),
    },
    content: Buffer.from(v.body_base64, 'base64'),
  };
}

// lossy says why amqplib cannot give a vector's message as amqp091-go does,
// or "": it decodes int64s, floats and doubles into JavaScript numbers.
function lossy(h) {
  if (h.type === 'int' && h.amqp === 'l' && !Number.isSafeInteger(Number(h.value))) return `int64 ${h.value} is beyond 2^53`;
  if (h.type === 'float' && h.amqp === 'd' && typeof h.value === 'number' && !Object.is(h.value, -0) &&
    headerValue(h.value) !== String(h.value)) return `double ${h.value} is exactly a float32`;
  const nested = h.type === 'table' ? Object.values(h.value) : h.type === 'array' ? h.value : [];
  return nested.map(lossy).find((r) => r) ?? '';
}

const vectors = JSON.parse(fs.readFileSync(vectorsFile, 'utf8'));

test('the vectors file has vectors', () => assert.ok(vectors.length > 0, vectorsFile));

// A vector amqplib cannot decode as amqp091-go does gets another id here:
// the limit docs/message-ids.md states, pinned so that it cannot widen.
for (const v of vectors) {
  const why = lossy({ type: 'table', value: v.headers });
  if (why) {
    test(`${v.name}: differs in Node (${why})`, () => assert.notEqual(deriveId(delivery(v)), v.id));
  } else {
    test(v.name, () => assert.equal(deriveId(delivery(v)), v.id));
  }
}
