// Peer clients for tests/interop.rs: N charges through stripe-node or orb-billing (a
// Stainless SDK), one JSON line per call on stdout. Run with NODE_PATH set to the
// node_modules the test harness installed.
//
//     node client.cjs stripe|orb <base URL> <calls> [<retries per call>, default 2]
'use strict';

const [peer, base, calls, retries] = process.argv.slice(2);
const n = Number(calls);
const maxRetries = Number(retries ?? 2);

async function stripeCalls() {
  const Stripe = require('stripe');
  const url = new URL(base);
  const stripe = new Stripe('sk_test_interop', {
    host: url.hostname,
    port: Number(url.port),
    protocol: 'http',
    maxNetworkRetries: maxRetries,
    telemetry: false,
  });
  for (let i = 0; i < n; i++) {
    const charge = await stripe.charges.create({ amount: 1000 + i, currency: 'eur' });
    const headers = charge.lastResponse.headers;
    console.log(JSON.stringify({
      id: charge.id,
      amount: charge.amount,
      key: headers['idempotency-key'] ?? charge.lastResponse.idempotencyKey ?? null,
      replayed: headers['idempotent-replayed'] === 'true',
    }));
  }
}

async function orbCalls() {
  const { Orb } = require('orb-billing');
  const orb = new Orb({ apiKey: 'interop', baseURL: `${base}/v1`, maxRetries });
  for (let i = 0; i < n; i++) {
    const { data, response } = await orb
      .post('/charges', { body: { amount: 1000 + i } })
      .withResponse();
    console.log(JSON.stringify({
      id: data.id,
      amount: data.amount,
      key: null,
      replayed: response.headers.get('idempotent-replayed') === 'true',
    }));
  }
}

const run = { stripe: stripeCalls, orb: orbCalls }[peer];
if (!run) {
  console.error(`unknown peer ${peer}: stripe or orb`);
  process.exit(2);
}
run().catch((e) => {
  console.error(e);
  process.exit(1);
});
