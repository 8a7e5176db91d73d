// Etsy statsd's servers/udp.js with a receive buffer: bench/ingest.py gives both daemons the
// same SO_RCVBUF (Etsy's own server takes the kernel default, 208 KiB). The kernel caps the
// request at net.core.rmem_max and doubles it, as for any unprivileged SO_RCVBUF.
const dgram = require('dgram');

exports.start = function (config, callback) {
  const server = dgram.createSocket({
    type: config.address_ipv6 ? 'udp6' : 'udp4',
    recvBufferSize: config.recvBufferSize || 8 << 20,
  }, callback);
  server.bind(config.port || 8125, config.address || undefined);
  this.server = server;
  return true;
};
