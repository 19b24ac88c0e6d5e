'use strict';
// A dual-read consumer: it reads the legacy RabbitMQ queue and a durable
// JetStream consumer at once, and runs its handler once per message id, with
// the inbox table of relayd's Go inbox package (docs/consumers.md, "Any
// language"). A Go and a Node service of one group can share the table.
// Its handler counts the runs of each id in HANDLER_TABLE (message_id text
// PRIMARY KEY, n int NOT NULL): put your work there.
const amqp = require('amqplib');
const { connect } = require('nats');
const { Pool } = require('pg');
const { setTimeout: sleep } = require('node:timers/promises');
const { deriveId } = require('./derive');

function env(name, fallback) {
  const v = process.env[name] || fallback;
  if (v === undefined) throw new Error(`${name} is not set`);
  return v;
}
// ident quotes "name" or "schema.name", lower-case as the Go inbox takes them.
function ident(name) {
  if (!/^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$/.test(name)) throw new Error(`table ${name}: want name or schema.name`);
  return name.split('.').map((p) => `"${p}"`).join('.');
}
const cfg = {
  database: env('DATABASE_URL'), amqp: env('AMQP_URL'), queue: env('QUEUE'),
  nats: env('NATS_URL'), stream: env('STREAM'), durable: env('DURABLE'), // an existing pull consumer, explicit acks
  consumer: env('CONSUMER'), // the consumer group: one name for all its instances, in any language
  inbox: ident(env('INBOX_TABLE', 'inbox')), handlerTable: ident(env('HANDLER_TABLE', 'processed')),
  prefetch: Number(env('PREFETCH', '50')),
};

// The message id as the Go inbox reads it: the broker's, else the one relayd
// backfill derived; a legacy message with neither gets that derivation here,
// or '' where amqplib cannot give the message as Go sees it (derive.js).
const amqpId = (m) => m.properties.messageId || String(m.properties.headers?.['Relay-Derived-Id'] ?? '') || deriveId(m);
const natsId = (m) => m.headers?.get('Nats-Msg-Id') || m.headers?.get('Relay-Derived-Id') || '';

class Poison extends Error {} // no usable id: retrying cannot help
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
// normalizeId is the Go inbox's: ids compare exactly, UUIDs lower-cased.
function normalizeId(id) {
  if (!id) throw new Poison('message has no id');
  if (Buffer.byteLength(id) > 1024 || /[\0\uFFFD]/.test(id)) { // U+FFFD: bytes that were not UTF-8
    throw new Poison(`invalid message id ${JSON.stringify(id.slice(0, 64))}`);
  }
  return UUID.test(id) ? id.toLowerCase() : id;
}

// processOnce records the message id, runs handle in the same transaction
// and commits; an id already recorded is not handled again. Ack only after
// it returns: a crash before the ack redelivers, and the id is then found.
async function processOnce(pool, msg, handle) {
  const client = await pool.connect();
  let broken;
  try {
    await client.query('BEGIN');
    const { rowCount } = await client.query(
      `INSERT INTO ${cfg.inbox} (consumer, message_id, source, received_at) VALUES ($1, $2, $3, now())
       ON CONFLICT (consumer, message_id) DO NOTHING`, [cfg.consumer, msg.id, msg.source]);
    if (rowCount === 1) await handle(client, msg); // new: do the work, in the same transaction
    await client.query('COMMIT');
    return rowCount === 1;
  } catch (err) {
    await client.query('ROLLBACK').catch((e) => { broken = e; });
    throw err;
  } finally {
    client.release(broken);
  }
}

// handle is the service's work. It writes through client, so its writes
// commit with the message id or not at all. This one counts runs per id.
async function handle(client, msg) {
  await client.query(`INSERT INTO ${cfg.handlerTable} AS p (message_id, n) VALUES ($1, 1)
    ON CONFLICT (message_id) DO UPDATE SET n = p.n + 1`, [msg.id]);
}

// settle reads msg's id, processes msg once and acks it on the broker it
// came from, the duplicates too; a failure is retried, a message without a
// usable id rejected: dead-lettered, if its queue has a dead-letter exchange.
async function settle(pool, msg, readId, { ack, retry, reject }) {
  try {
    try { msg.id = readId(); } catch (err) { throw new Poison(`no id: ${err.message}`); }
    msg.id = normalizeId(msg.id);
    await processOnce(pool, msg, handle);
    ack();
  } catch (err) {
    console.error(`${msg.source} message ${msg.id || '(no id)'} not processed: ${err.message}`);
    try { await (err instanceof Poison ? reject : retry)(); } catch { /* stopping, channel gone: the broker redelivers */ }
  }
}

// backoff is the wait before a failed nth delivery is redelivered: 1 s, doubling, up
// to 60 s, so that a database outage does not spin into a quorum queue's delivery-limit.
const backoff = (n) => Math.min(1000 * 2 ** (Math.max(n, 1) - 1), 60000);

async function main() {
  // Timeouts: a hung query (ROLLBACK too) fails, and postgres ends a transaction left idle, with its locks.
  const pool = new Pool({ connectionString: cfg.database, max: 10, query_timeout: 30000,
    idle_in_transaction_session_timeout: 60000 });
  pool.on('error', (err) => console.error(`postgres: ${err.message}`));
  const amqpBusy = new Set(), natsBusy = new Set(); // the settles in flight
  const track = (busy, p) => { busy.add(p); p.finally(() => busy.delete(p)); };
  const stopping = new AbortController(); // aborted on stop, with the retries' waits: closing the channel requeues
  const fail = (what) => (err) => {
    if (stopping.signal.aborted) return;
    console.error(`${what}: ${err?.message ?? 'closed'}`);
    process.exit(1); // let the supervisor restart it: unacked messages are redelivered
  };

  // Legacy: the RabbitMQ queue, manual acks, bounded prefetch.
  const conn = await amqp.connect(cfg.amqp);
  for (const event of ['close', 'error']) conn.on(event, fail('rabbitmq connection'));
  const ch = await conn.createChannel();
  ch.on('error', fail('rabbitmq channel'));
  await ch.prefetch(cfg.prefetch);
  const { consumerTag } = await ch.consume(cfg.queue, (m) => {
    if (m === null) return fail('rabbitmq cancelled the consumer')();
    const msg = { source: 'amqp', subject: m.fields.routingKey, headers: m.properties.headers, payload: m.content };
    const deliveries = Number(m.properties.headers?.['x-delivery-count'] ?? 0) + 1; // a quorum queue counts them
    const retry = () => sleep(backoff(deliveries), null, { signal: stopping.signal }).then(() => ch.nack(m, false, true));
    track(amqpBusy, settle(pool, msg, () => amqpId(m), { ack: () => ch.ack(m), retry, reject: () => ch.nack(m, false, false) }));
  }, { noAck: false });

  // New: the durable JetStream pull consumer, explicit acks.
  const nc = await connect({ servers: cfg.nats, maxReconnectAttempts: -1 });
  nc.closed().then(fail('nats connection'));
  const consumer = await nc.jetstream().consumers.get(cfg.stream, cfg.durable);
  const messages = await consumer.consume({ max_messages: cfg.prefetch });
  const natsDone = (async () => {
    for await (const m of messages) {
      while (natsBusy.size >= cfg.prefetch) await Promise.race(natsBusy);
      const msg = { source: 'nats', subject: m.subject, headers: m.headers, payload: m.data };
      const retry = () => m.nak(backoff(m.info.deliveryCount));
      track(natsBusy, settle(pool, msg, () => natsId(m), { ack: () => m.ack(), retry, reject: () => m.term() }));
    }
  })();
  natsDone.then(() => stopping.signal.aborted || fail('jetstream consume')(), fail('jetstream consume'));
  console.log(`consuming queue ${cfg.queue} and ${cfg.stream}/${cfg.durable} as ${cfg.consumer}`);

  // Soft stop: stop receiving, finish what was received, then close.
  const stop = async () => {
    if (stopping.signal.aborted) return;
    stopping.abort();
    await ch.cancel(consumerTag);
    messages.stop();
    await natsDone;
    await Promise.all([...amqpBusy, ...natsBusy]);
    await ch.close();
    await conn.close();
    await nc.drain();
    await pool.end();
    console.log('stopped');
    process.exit(0);
  };
  for (const sig of ['SIGTERM', 'SIGINT']) {
    process.once(sig, () => stop().catch((err) => { console.error(`stop: ${err.message}`); process.exit(1); }));
  }
}

main().catch((err) => { console.error(err); process.exit(1); });
