// Etsy statsd backend for bench/ingest.py: adds up statsd.metrics_received (the lines the
// daemon accepted, per flush) and writes the running total to $ETSY_COUNT_FILE after each
// flush. Flushes nothing anywhere else.
const fs = require('fs');
let total = 0;
exports.init = function (startupTime, config, events) {
  const out = process.env.ETSY_COUNT_FILE;
  events.on('flush', function (timestamp, metrics) {
    total += metrics.counters['statsd.metrics_received'] || 0;
    fs.writeFileSync(out + '.tmp', String(total));
    fs.renameSync(out + '.tmp', out);
  });
  return true;
};
