// The charge app of examples/common/charge_app.rs behind express-idempotency, for the
// load program's `--peers` (perf/src/bin/load/peers.rs starts it with NODE_PATH set to
// the pinned packages it installed): `POST /v1/charges` (JSON `{"amount": n}`, key in
// `Idempotency-Key`) answers `200 {"id": "ch_<n>", "object": "charge", "amount": n}` and
// counts the charge; `GET /stats` answers `{"executions": n}`. It listens on a free port
// of 127.0.0.1 and prints `EXPRESS 127.0.0.1:<port>`.
//
// The store is a `Map` behind express-idempotency's data adapter interface, as its README
// invites: the adapter it ships (InMemoryDataAdapter) keeps records in an array and
// scans it on every call, which its README says is not for production; with it, the
// figure would measure the length of the array, not the middleware. No logging; ETag
// and X-Powered-By off (per-response work of express's that the Rust apps do not do).
'use strict';

const express = require('express');
const { idempotency, getSharedIdempotencyService } = require('express-idempotency');

class MapDataAdapter {
  constructor() {
    this.resources = new Map();
  }

  async findByIdempotencyKey(key) {
    return this.resources.get(key) ?? null;
  }

  async create(resource) {
    if (this.resources.has(resource.idempotencyKey)) {
      throw new Error('Duplicate');
    }
    this.resources.set(resource.idempotencyKey, resource);
  }

  async update(resource) {
    this.resources.set(resource.idempotencyKey, resource);
  }

  async delete(key) {
    this.resources.delete(key);
  }
}

let executions = 0;
const app = express();
app.disable('etag');
app.disable('x-powered-by');
app.post(
  '/v1/charges',
  express.json(),
  idempotency({ idempotencyKeyHeader: 'idempotency-key', dataAdapter: new MapDataAdapter() }),
  (req, res) => {
    // The middleware calls the handler on a replay too, after answering: its README's
    // way to skip the work is this check.
    if (getSharedIdempotencyService().isHit(req)) {
      return;
    }
    const amount = req.body && req.body.amount;
    if (!Number.isInteger(amount)) {
      res.status(422).json({ error: 'amount must be an integer' });
      return;
    }
    executions += 1;
    res.json({ id: `ch_${executions}`, object: 'charge', amount });
  },
);
app.get('/stats', (_req, res) => {
  res.json({ executions });
});

const server = app.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  process.stdout.write(`EXPRESS 127.0.0.1:${port}\n`);
});
server.keepAliveTimeout = 60_000;
